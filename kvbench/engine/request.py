"""A generation request and its life cycle, shared by the tensor engine and the simulator.

Lengths are counted in KV token slots. A request with P prompt tokens and O output tokens writes
``P + O - 1`` token states: the last sampled token is returned but never fed back through the model.

A request may end before ``max_tokens`` at an EOS token. The tensor engine learns that only when the model
emits it; the simulator, having no model, is told in advance (``eos_after``, e.g. a dataset's real answer
length). Either way KV managers and admission see only ``max_tokens``: nobody serving the request knows
where it will end, which is why a contiguous engine must reserve for the worst case.

While running, a request's progress is a function of the scheduler's decode clock (one tick per decode
step in which every running request advances one token), so the simulator can skip many steps at once:
``kv_len(clock) = kv_at_base + clock - clock_base`` and ``outputs(clock) = outputs_at_base + clock - clock_base``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"  # withdrawn by its client (a server's disconnect or stop string): its KV is freed


@dataclass(eq=False)
class Request:
    request_id: int
    prompt_len: int
    max_tokens: int
    prompt_token_ids: list[int] | None = None
    arrival_time: float = 0.0
    parent_id: int | None = None  # forked from (parallel sampling, beam search)
    num_samples: int = 1  # parallel sampling: the prompt is prefilled once and forked into this many samples
    sample_index: int = 0  # which sample of its group this sequence is

    status: RequestStatus = RequestStatus.WAITING
    num_outputs: int = 0  # output tokens produced before the current run (recompute keeps them)
    kv_at_base: int = 0
    outputs_at_base: int = 0
    clock_base: int = 0
    held_slots: int = 0  # KV slots the manager gives it now (kept here for O(1) accounting)
    admit_seq: int = -1  # admission order; preemption takes the newest first
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # tokens of its last admission whose KV a prefix cache held (not recomputed)
    first_cached_tokens: int | None = None  # the same at its first admission (what a server's answer reports)
    reject_reason: str | None = None
    reject_kind: str | None = (
        None  # "too_long" (over max-len), "pool" (larger than the whole pool), "oom" (no room now)
    )
    final_kv_len: int | None = None  # set when it finishes (hindsight)
    output_token_ids: list[int] = field(default_factory=list)
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    sampling: Any = None  # SamplingParams of the tensor engine; the simulator needs none
    stop_reason: str | None = None
    eos_after: int | None = None  # simulator only: the output count at which the request emits EOS

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError(f"request {self.request_id}: prompt length must be at least 1")
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_tokens must be at least 1")
        if self.eos_after is not None and self.eos_after < 1:
            raise ValueError(f"request {self.request_id}: eos_after must be at least 1")

    @property
    def expected_kv_len(self) -> int:
        """KV slots the request writes if it runs to max_tokens: what admission and reservations plan for."""
        return self.prompt_len + self.max_tokens - 1

    @property
    def target_outputs(self) -> int:
        """Output tokens it will produce: ``eos_after`` when the simulator knows it, else ``max_tokens``."""
        return self.max_tokens if self.eos_after is None else min(self.eos_after, self.max_tokens)

    @property
    def target_kv_len(self) -> int:
        """KV slots it will have written when it ends (hindsight accounting; the simulator knows it in advance)."""
        return self.prompt_len + self.target_outputs - 1

    def kv_len(self, clock: int) -> int:
        return self.kv_at_base + clock - self.clock_base

    def outputs(self, clock: int) -> int:
        return self.outputs_at_base + clock - self.clock_base

    def finish_clock(self) -> int:
        """The decode clock at which it has produced its target outputs (the tensor engine: max_tokens, unless
        an EOS comes first)."""
        return self.clock_base + self.target_outputs - self.outputs_at_base

    def prefill_len(self) -> int:
        """Tokens to run through the model on (re)admission: the prompt plus outputs kept from before."""
        return self.prompt_len + self.num_outputs

    def prefill_token_ids(self) -> list[int]:
        """The token ids of ``prefill_len``: the prompt, then the outputs kept across a preemption."""
        assert self.prompt_token_ids is not None, "a request run through a model carries its token ids"
        return [*self.prompt_token_ids, *self.output_token_ids]


def make_request(request_id: int, prompt_token_ids: list[int], params: Any, num_samples: int = 1) -> Request:
    """A request for the tensor engine; ``num_samples`` > 1 asks the paged engine for parallel samples."""
    request = Request(
        request_id,
        len(prompt_token_ids),
        params.max_tokens,
        prompt_token_ids=list(prompt_token_ids),
        num_samples=num_samples,
    )
    request.sampling = params
    return request
