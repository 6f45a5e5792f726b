"""The share study's length checks: every request of a run fits max-len, refused before any work."""

from __future__ import annotations

import pytest

from kvbench.errors import KvbenchError
from kvbench.studies.share import check_prompts_fit, check_share_lengths, longest_prompt, make_prompts


@pytest.mark.parametrize("max_len, output_len", [(2048, 4), (2048, 64), (100, 1), (4, 3), (4096, 1000)])
def test_the_suggested_prompt_len_fits_and_one_more_does_not(max_len, output_len):
    with pytest.raises(KvbenchError) as refused:
        check_share_lengths(max_len, output_len, max_len)
    suggested = int(str(refused.value).split("use a prompt length of ")[1].split(" ")[0].replace(",", ""))
    check_share_lengths(suggested, output_len, max_len)  # accepted
    assert longest_prompt(suggested) + output_len <= max_len
    with pytest.raises(KvbenchError):
        check_share_lengths(suggested + 1, output_len, max_len)


def test_the_bound_is_the_longest_prompt_drawn():
    prompts = make_prompts(2000, 9, 100, seed=0)
    assert max(map(len, prompts)) == longest_prompt(9) == 13


def test_an_output_that_fills_max_len_is_refused_and_a_dataset_checks_only_the_output():
    with pytest.raises(KvbenchError, match="leaves no room"):
        check_share_lengths(1, 2048, 2048, 4096, random_prompts=False)
    check_share_lengths(10**9, 64, 2048, 4096, random_prompts=False)  # a dataset's prompts are cut to fit


def test_prompts_that_do_not_fit_are_refused():
    check_prompts_fit([[1] * 10], 6, 16)
    with pytest.raises(KvbenchError, match="above max-len 16"):
        check_prompts_fit([[1] * 10, [1] * 11], 6, 16)
