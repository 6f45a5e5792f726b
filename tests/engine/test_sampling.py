"""Sampling: greedy is argmax, filters restrict the support, seeds make draws independent of the batch."""

from __future__ import annotations

import pytest
import torch

from kvbench.engine.sampling import SamplingParams, make_generator, sample
from kvbench.errors import KvbenchError

VOCAB = 50


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def draws(logits_row: torch.Tensor, params: SamplingParams, n: int) -> list[int]:
    generator = make_generator(params.seed)
    return [sample(logits_row[None], [params], [generator])[0] for _ in range(n)]


def test_greedy_is_argmax() -> None:
    logits = random_logits(6)
    params = [SamplingParams()] * 6
    assert sample(logits, params, [None] * 6) == logits.argmax(-1).tolist()


def test_top_k_one_is_greedy() -> None:
    logits = random_logits(4, seed=1)
    params = [SamplingParams(temperature=1.5, top_k=1, seed=s) for s in range(4)]
    assert sample(logits, params, [make_generator(s) for s in range(4)]) == logits.argmax(-1).tolist()


def test_tiny_temperature_is_greedy() -> None:
    logits = random_logits(3, seed=2)
    params = [SamplingParams(temperature=1e-7, seed=0)] * 3
    assert sample(logits, params, [make_generator(0)] * 3) == logits.argmax(-1).tolist()


def test_top_k_restricts_support() -> None:
    logits = random_logits(1, seed=3)[0]
    allowed = set(logits.topk(5).indices.tolist())
    tokens = draws(logits, SamplingParams(temperature=5.0, top_k=5, seed=4), 300)
    assert set(tokens) <= allowed
    assert len(set(tokens)) == 5  # a hot temperature reaches every allowed token


def test_top_p_restricts_to_the_nucleus() -> None:
    logits = torch.full((VOCAB,), -10.0)
    logits[[3, 7, 11]] = torch.tensor([2.0, 1.5, 1.0])  # these three hold ~99.9% of the mass
    probs = torch.softmax(logits, -1)
    assert probs[3] + probs[7] < 0.9 < probs[3] + probs[7] + probs[11]
    tokens = draws(logits, SamplingParams(temperature=1.0, top_p=0.9, seed=5), 400)
    assert set(tokens) == {3, 7, 11}
    tokens = draws(logits, SamplingParams(temperature=1.0, top_p=0.3, seed=5), 50)
    assert set(tokens) == {3}  # the top token alone exceeds 0.3


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2] + [1e-9] * (VOCAB - 3)))
    tokens = draws(logits, SamplingParams(temperature=1.0, seed=6), 1200)
    freq = torch.bincount(torch.tensor(tokens), minlength=VOCAB)[:3].float() / len(tokens)
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.05, rtol=0)


def test_same_seed_same_draws_whatever_the_batch() -> None:
    logits = random_logits(5, seed=7)
    target = SamplingParams(temperature=1.0, top_p=0.95, top_k=20, seed=42)
    alone_gen = make_generator(42)
    alone = [sample(logits[2:3], [target], [alone_gen])[0] for _ in range(20)]
    neighbours = [SamplingParams(), SamplingParams(temperature=0.7, seed=1), target,
                  SamplingParams(temperature=2.0, seed=2), SamplingParams(temperature=1.0, top_k=3, seed=3)]
    gens = [None] + [make_generator(p.seed) for p in neighbours[1:]]
    batched = [sample(logits, neighbours, gens)[2] for _ in range(20)]
    assert batched == alone
    assert len(set(alone)) > 1


def test_different_seeds_differ() -> None:
    logits = random_logits(1, seed=8)[0]
    a = draws(logits, SamplingParams(temperature=1.0, seed=1), 30)
    b = draws(logits, SamplingParams(temperature=1.0, seed=2), 30)
    assert a != b


def test_unseeded_generator_works() -> None:
    generator = make_generator(None)
    token = sample(random_logits(1), [SamplingParams(temperature=1.0)], [generator])[0]
    assert 0 <= token < VOCAB


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1}, {"temperature": float("nan")}, {"temperature": "hot"}, {"top_k": -2},
        {"top_k": 2.5}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_tokens": 0}, {"max_tokens": True},
        {"seed": -1}, {"seed": 1.0}, {"eos_token_id": -3}, {"ignore_eos": "yes"},
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


def test_missing_generator_for_sampled_row() -> None:
    with pytest.raises(ValueError, match="generator"):
        sample(random_logits(1), [SamplingParams(temperature=1.0)], [None])
