"""Token choice over a step's logits: greedy, temperature, top-k and top-p, and beam-search candidates.

:func:`sample` handles a whole batch: greedy rows with one ``argmax``, sampled rows with one sort and one
inverse-CDF lookup. Each sampled row draws exactly one uniform number from its own request's generator, so a
request with a given seed gets the same tokens whatever other requests share its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class SamplingSettings(Protocol):
    """What the sampler reads of a request's sampling parameters."""

    temperature: float
    top_k: int
    top_p: float

    @property
    def is_greedy(self) -> bool: ...


def make_generator(seed: int | None = None, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's own random stream: seeded when ``seed`` is given, else from fresh entropy.

    Keep it on the CPU (the default) even for CUDA logits: the draws are then the same on every device.
    """
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingSettings],
    generators: Sequence[torch.Generator | None],
    rows: Sequence[int] | None = None,
) -> list[int]:
    """One token per row of ``logits [B, V]``; ``generators[b]`` may be None for greedy rows.

    ``rows`` picks (and may repeat) the logits rows to sample from, e.g. a prompt's row once per parallel
    sample; ``params`` and ``generators`` then follow ``rows``.
    """
    if rows is not None:
        logits = logits[torch.as_tensor(list(rows), device=logits.device)]
    if logits.ndim != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match {len(params)} params / {len(generators)} generators"
        )
    greedy_rows = [p.is_greedy for p in params]
    if all(greedy_rows):
        return _argmax(logits)
    greedy = [b for b, is_greedy in enumerate(greedy_rows) if is_greedy]
    sampled = [b for b, is_greedy in enumerate(greedy_rows) if not is_greedy]
    tokens = [0] * len(params)
    if greedy:
        greedy_index = torch.tensor(greedy, device=logits.device)
        for b, token in zip(greedy, _argmax(logits[greedy_index]), strict=True):
            tokens[b] = token
    sampled_index = torch.tensor(sampled, device=logits.device)
    chosen = _sample_rows(
        logits[sampled_index].float(),
        [params[b] for b in sampled],
        [_generator_for(generators[b], params[b]) for b in sampled],
    )
    for b, token in zip(sampled, chosen, strict=True):
        tokens[b] = token
    return tokens


def _argmax(logits: torch.Tensor) -> list[int]:
    """Index of each row's largest logit, the first of equal ones (as ``argmax``). ``max(dim)`` gives the same
    index and is 2-3x faster than ``argmax`` over a large vocabulary on a CPU (measured at 16 x 49,152)."""
    return logits.max(dim=-1).indices.tolist()


def _generator_for(generator: torch.Generator | None, params: SamplingSettings) -> torch.Generator:
    if generator is None:
        raise ValueError("a sampled request needs its generator (make_generator(params.seed))")
    return generator


def _sample_rows(
    logits: torch.Tensor, params: Sequence[SamplingSettings], generators: list[torch.Generator]
) -> list[int]:
    """Temperature, then top-k and top-p over the sorted distribution, then one inverse-CDF draw per row."""
    device, vocab = logits.device, logits.shape[1]
    temps = torch.tensor([p.temperature for p in params], device=device, dtype=torch.float32)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
    sorted_logits, order = torch.sort(logits / temps[:, None], dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)
    sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass of the more likely tokens
    probs = probs.masked_fill(before >= top_p[:, None], 0.0)  # the first token always stays
    cdf = torch.cumsum(probs, dim=-1)
    # one draw per row from its own generator (CPU generators are the portable choice), one copy to the device
    uniforms = torch.tensor([float(torch.rand((), generator=g, device=g.device)) for g in generators], device=device)
    picks = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).clamp_(max=vocab - 1)
    return order.gather(1, picks).squeeze(1).tolist()


def beam_candidates(
    logits: torch.Tensor, scores: Sequence[float], count: int
) -> tuple[list[float], list[int], list[int]]:
    """The ``count`` best continuations of beams with cumulative log-prob ``scores`` (one logits row each).

    Returns their new scores (float32 sums, best first), the parent row of each and its token.
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    flat = (log_probs + torch.tensor(scores, dtype=torch.float32, device=log_probs.device)[:, None]).reshape(-1)
    top, index = torch.topk(flat, k=min(count, flat.numel()))
    vocab = log_probs.shape[-1]
    return top.tolist(), (index // vocab).tolist(), (index % vocab).tolist()


def rank_finished(scores: Sequence[float], divisor: float, count: int) -> list[tuple[int, float]]:
    """(index, score / divisor) of the ``count`` best finished hypotheses, best first (float32 arithmetic)."""
    final = torch.tensor(scores, dtype=torch.float32) / divisor
    order = torch.topk(final, k=min(count, final.numel())).indices.tolist()
    return [(i, float(final[i])) for i in order]
