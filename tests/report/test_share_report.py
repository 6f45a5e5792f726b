"""share's figures with their meaning: the cost of n samples explained by prompt and answer lengths, beside the
article's figure, with its arithmetic right."""

from __future__ import annotations

import pytest

from kvbench.report.share_report import cost_explanation
from kvbench.results.share_result import ShareResult
from kvbench.studies.share import ANCHORS


def _document(**meta):
    """A hand-made share document with only what the explanation reads."""
    return ShareResult.from_json(
        {
            "meta": {"kind": "parallel", "width": 5, "prompt_len_mean": 54.0, "output_len_mean": 64.0, **meta},
            "savings": {"paged-shared_cost_vs_width1_mean": 2.83, "paged-shared_cost_vs_width1_peak": 3.39},
        }
    )


def test_the_cost_of_n_samples_is_explained_by_prompt_and_answer_lengths():
    text = cost_explanation(_document())
    assert text is not None
    assert "(54 + 5 x 64) / (54 + 64) = 3.17x" in text  # (54 + 320) / 118
    assert "measured 3.39x at peak" in text and "2.83x step-averaged" in text
    assert "the article's 1.4x at n=5 holds where prompts are about 9x longer than answers" in text  # (9+5)/(9+1)


@pytest.mark.parametrize("meta", [{"kind": "beam"}, {"width": 1}, {"prompt_len_mean": None}])
def test_no_explanation_where_the_formula_does_not_apply(meta):
    assert cost_explanation(_document(**meta)) is None


def test_the_articles_figure_is_quoted_as_a_ratio():
    """5 samples without sharing cost 5x one sample (+400%), not "+500%"."""
    assert "1.4x the memory of one sample instead of 5x" in ANCHORS["parallel"] and "+500%" not in ANCHORS["parallel"]
