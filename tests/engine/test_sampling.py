"""Sampling parameters: validation and the stop rules (EOS, max tokens)."""

from __future__ import annotations

import pytest

from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": "hot"},
        {"top_k": -2},
        {"top_k": 2.5},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"max_tokens": True},
        {"seed": -1},
        {"seed": 1.0},
        {"eos_token_id": -3},
        {"ignore_eos": "yes"},
    ],
)
def test_bad_params_raise(kwargs: dict) -> None:
    with pytest.raises(KvbenchError):
        SamplingParams(**kwargs)


def test_stop_rules() -> None:
    params = SamplingParams(max_tokens=3, eos_token_id=9)
    assert params.stop_reason(9, 1) == "eos"
    assert params.stop_reason(4, 2) is None
    assert params.stop_reason(4, 3) == "length"
    model_eos = SamplingParams(max_tokens=5)
    assert model_eos.stop_reason(2, 1, model_eos_token_id=2) == "eos"
    assert model_eos.stop_reason(2, 1) is None
    ignoring = SamplingParams(max_tokens=5, eos_token_id=9, ignore_eos=True)
    assert ignoring.eos() is None and ignoring.stop_reason(9, 1) is None
