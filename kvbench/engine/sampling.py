"""Sampling: greedy, temperature, top-k and top-p with a per-request seeded generator, and stop rules.

:func:`sample` handles a whole batch: greedy rows with one ``argmax``, sampled rows with one sort and one
inverse-CDF lookup. Each sampled row draws exactly one uniform number from its own request's generator, so a
request with a given seed gets the same tokens whatever other requests share its batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from kvbench.errors import KvbenchError

GREEDY_EPS = 1e-5  # temperatures below this are greedy (dividing by them would overflow)
StopReason = Literal["length", "eos"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and when it stops.

    ``temperature`` 0 is greedy; ``top_k`` 0 (or -1) and ``top_p`` 1.0 disable those filters. ``seed`` fixes the
    request's own generator (None: a random seed). Generation stops after ``max_tokens`` tokens, or at the EOS
    token unless ``ignore_eos``; ``eos_token_id`` None means the model's EOS (or none if the model has none).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    ignore_eos: bool = False
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise KvbenchError(f"temperature must be >= 0, got {self.temperature}")
        _check_int("top_k", self.top_k)
        if self.top_k < -1:
            raise KvbenchError(f"top_k must be >= 1, or 0/-1 to disable it; got {self.top_k}")
        _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise KvbenchError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            _check_int("seed", self.seed)
            if self.seed < 0:
                raise KvbenchError(f"seed must be >= 0, got {self.seed}")
        _check_int("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise KvbenchError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not isinstance(self.ignore_eos, bool):
            raise KvbenchError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if self.eos_token_id is not None:
            _check_int("eos_token_id", self.eos_token_id)
            if self.eos_token_id < 0:
                raise KvbenchError(f"eos_token_id must be >= 0, got {self.eos_token_id}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    def eos(self, model_eos_token_id: int | None = None) -> int | None:
        """The token that ends this request, or None (no EOS, or ``ignore_eos``)."""
        if self.ignore_eos:
            return None
        return self.eos_token_id if self.eos_token_id is not None else model_eos_token_id

    def stop_reason(
        self, token_id: int, num_output_tokens: int, model_eos_token_id: int | None = None
    ) -> StopReason | None:
        """Why the request stops after emitting ``token_id`` as its ``num_output_tokens``-th token, if it does."""
        eos = self.eos(model_eos_token_id)
        if eos is not None and token_id == eos:
            return "eos"
        if num_output_tokens >= self.max_tokens:
            return "length"
        return None


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise KvbenchError(f"{name} must be a finite number, got {value!r}")


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KvbenchError(f"{name} must be an integer, got {value!r}")


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
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[int]:
    """One token per row of ``logits [B, V]``; ``generators[b]`` may be None for greedy rows."""
    if logits.ndim != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(f"logits {tuple(logits.shape)} do not match {len(params)} params / {len(generators)} generators")
    greedy_rows = [p.is_greedy for p in params]
    if all(greedy_rows):
        return logits.argmax(dim=-1).tolist()
    greedy = [b for b, is_greedy in enumerate(greedy_rows) if is_greedy]
    sampled = [b for b, is_greedy in enumerate(greedy_rows) if not is_greedy]
    tokens = [0] * len(params)
    if greedy:
        rows = torch.tensor(greedy, device=logits.device)
        for b, token in zip(greedy, logits[rows].argmax(dim=-1).tolist(), strict=True):
            tokens[b] = token
    rows = torch.tensor(sampled, device=logits.device)
    chosen = _sample_rows(
        logits[rows].float(),
        [params[b] for b in sampled],
        [_generator_for(generators[b], params[b]) for b in sampled],
    )
    for b, token in zip(sampled, chosen, strict=True):
        tokens[b] = token
    return tokens


def _generator_for(generator: torch.Generator | None, params: SamplingParams) -> torch.Generator:
    if generator is None:
        raise ValueError("a sampled request needs its generator (make_generator(params.seed))")
    return generator


def _sample_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> list[int]:
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
