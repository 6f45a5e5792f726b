"""The sampler: greedy is argmax, filters restrict the support, seeds make draws independent of the batch."""

from __future__ import annotations

import pytest
import torch

from kvbench.engine.sampling import SamplingParams
from kvbench.models.sampler import beam_candidates, make_generator, rank_finished, sample

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


def test_greedy_ties_take_the_first_index_as_argmax_does() -> None:
    logits = torch.zeros(3, 49152)
    logits[0, [7, 40000]] = 1.0
    logits[1, [49000, 3]] = 2.0
    logits[2] = -torch.inf
    logits[2, [100, 200]] = 0.0
    params = [SamplingParams()] * 3
    assert sample(logits, params, [None] * 3) == [7, 3, 100] == logits.argmax(-1).tolist()
    mixed = [SamplingParams(), SamplingParams(temperature=1.0, seed=1), SamplingParams()]
    assert sample(logits, mixed, [None, make_generator(1), None])[::2] == [7, 100]


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
    neighbours = [
        SamplingParams(),
        SamplingParams(temperature=0.7, seed=1),
        target,
        SamplingParams(temperature=2.0, seed=2),
        SamplingParams(temperature=1.0, top_k=3, seed=3),
    ]
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


def test_missing_generator_for_sampled_row() -> None:
    with pytest.raises(ValueError, match="generator"):
        sample(random_logits(1), [SamplingParams(temperature=1.0)], [None])


def test_rows_pick_and_repeat_logits_rows() -> None:
    logits = random_logits(3, seed=9)
    params = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2)]
    repeated = sample(logits, params, [make_generator(1), make_generator(2)], rows=[1, 1])
    one_by_one = [sample(logits[1:2], [p], [make_generator(p.seed)])[0] for p in params]
    assert repeated == one_by_one


def test_beam_candidates_rank_every_continuation_of_every_beam() -> None:
    logits = random_logits(2, seed=10)
    scores = [-1.0, -3.0]
    top, parents, tokens = beam_candidates(logits, scores, 4)
    full = torch.log_softmax(logits, -1) + torch.tensor(scores)[:, None]
    expected = full.reshape(-1).topk(4)
    assert top == expected.values.tolist()
    assert [p * VOCAB + t for p, t in zip(parents, tokens, strict=True)] == expected.indices.tolist()
    assert rank_finished([-4.0, -2.0, -3.0], 2.0, 2) == [(1, -1.0), (2, -1.5)]
