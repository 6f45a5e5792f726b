"""How a request picks its tokens and when it stops: greedy, temperature, top-k and top-p, a seed, EOS.

The draws themselves are tensor work, done by the model side (``kvbench.models.sampler``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kvbench.errors import KvbenchError

GREEDY_EPS = 1e-5  # temperatures below this are greedy (dividing by them would overflow)
StopReason = Literal["length", "eos", "stop"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and when it stops.

    ``temperature`` 0 is greedy; ``top_k`` 0 (or -1) and ``top_p`` 1.0 disable those filters. ``seed`` fixes the
    request's own generator (None: a random seed). Generation stops after ``max_tokens`` tokens, or at the EOS
    token unless ``ignore_eos``; ``eos_token_id`` None means the model's EOS (or none if the model has none).
    ``stop_token_ids`` end the request too (as in vLLM's API), unless ``ignore_eos``.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    ignore_eos: bool = False
    eos_token_id: int | None = None
    stop_token_ids: tuple[int, ...] = ()

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
        if not isinstance(self.stop_token_ids, tuple):
            raise KvbenchError(f"stop_token_ids must be a tuple of token ids, got {self.stop_token_ids!r}")
        for token in self.stop_token_ids:
            _check_int("stop_token_ids", token)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    def eos(self, model_eos_token_id: int | None = None) -> int | None:
        """The token that ends this request, or None (no EOS, or ``ignore_eos``)."""
        if self.ignore_eos:
            return None
        return self.eos_token_id if self.eos_token_id is not None else model_eos_token_id

    def stop_reason(
        self,
        token_id: int,
        num_output_tokens: int,
        model_eos_token_id: int | None = None,
        model_stop_ids: frozenset[int] | tuple[int, ...] = (),
    ) -> StopReason | None:
        """Why the request stops after emitting ``token_id`` as its ``num_output_tokens``-th token, if it does.

        ``model_stop_ids`` are the model's other end-of-answer tokens (a generation config's EOS list): they
        count as EOS unless the request names its own ``eos_token_id``.
        """
        if not self.ignore_eos:
            eos = self.eos(model_eos_token_id)
            if token_id == eos or (self.eos_token_id is None and token_id in model_stop_ids):
                return "eos"
            if token_id in self.stop_token_ids:
                return "stop"
        if num_output_tokens >= self.max_tokens:
            return "length"
        return None


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise KvbenchError(f"{name} must be a finite number, got {value!r}")


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KvbenchError(f"{name} must be an integer, got {value!r}")
