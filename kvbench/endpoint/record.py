"""The outcome of one request: completed with its timings, or failed with the reason.

Every request a point plans ends as exactly one record, whatever happens: the load patterns write one for each
request they send, cancel or never get to send, so a point's records always add up to its requests.

Times are ``time.perf_counter()`` seconds: ``start`` when the request was sent, ``end`` when it ended (the
stream closed or it failed), ``arrival`` when the load pattern released it (open loop: its scheduled arrival; the
difference is time spent waiting for the
concurrency cap), and ``token_times`` when each token event arrived, relative to ``start``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Why a request failed. "http": the server answered with an error status (429, 500, ...); "timeout": not done
# within the request's time limit; "stall": no byte for the stall limit; "connect": no connection; "disconnect":
# the connection closed before the stream's end; "malformed": the response is not the event stream the protocol
# promises; "server_error": the stream reported an error; "skipped": an earlier turn of its conversation failed,
# so its history does not exist; "cancelled": still in flight when the point was stopped; "not_sent": the point
# was stopped before it was sent; "client": an unexpected error in the client itself.
FAILURE_KINDS = (
    "http",
    "timeout",
    "stall",
    "connect",
    "disconnect",
    "malformed",
    "server_error",
    "skipped",
    "cancelled",
    "not_sent",
    "client",
)


@dataclass(eq=False)
class RequestRecord:
    conversation: int
    turn: int
    start: float = 0.0
    arrival: float | None = None
    end: float | None = None  # when it ended, completed or failed
    ok: bool = False
    error_kind: str | None = None
    error: str | None = None
    status: int | None = None  # the HTTP status, when one came
    ttft: float | None = None  # seconds from start to the first token event
    latency: float | None = None  # seconds from start to the last token event (E2EL, as vLLM's bench times it)
    token_times: list[float] = field(default_factory=list)
    output_tokens: int | None = None
    output_tokens_from: str | None = None  # "usage" | "tokenizer" | "events"
    prompt_tokens: int | None = None
    prompt_tokens_from: str | None = None  # "usage" | "workload" | "tokenizer"
    cached_tokens: int | None = None  # prompt tokens the server's prefix cache served (None: it did not say)
    finish_reason: str | None = None
    text: str = ""  # the generated text (a multi-turn conversation resends it)
    prompt_input: Any = None  # the prompt or messages sent, kept only while its token count is unknown

    def fail(self, kind: str, message: str, status: int | None = None) -> RequestRecord:
        assert kind in FAILURE_KINDS, kind
        self.ok, self.error_kind, self.error = False, kind, message
        if status is not None:
            self.status = status
        return self

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive token events."""
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    @property
    def tpot(self) -> float | None:
        """(E2EL - TTFT) / (output tokens - 1), vLLM's definition; None with fewer than 2 tokens."""
        if (
            not self.ok
            or self.output_tokens is None
            or self.output_tokens < 2
            or self.latency is None
            or self.ttft is None
        ):
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def reason(self) -> str:
        """The failure as one line: kind, status, message."""
        status = f" {self.status}" if self.status is not None and self.error_kind == "http" else ""
        return f"{self.error_kind}{status}: {self.error}" if self.error else f"{self.error_kind}{status}"

    def as_json(self, with_text: bool = False) -> dict[str, Any]:
        """A JSON-ready row (times relative to ``start``; the text only when asked for)."""
        row = {
            "conversation": self.conversation,
            "turn": self.turn,
            "ok": self.ok,
            "start": self.start,
            "queue_s": None if self.arrival is None else self.start - self.arrival,
            "ttft_s": self.ttft,
            "e2el_s": self.latency,
            "tpot_s": self.tpot,
            "token_events": len(self.token_times),
            "output_tokens": self.output_tokens,
            "output_tokens_from": self.output_tokens_from,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_from": self.prompt_tokens_from,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "error_kind": self.error_kind,
            "status": self.status,
            "error": self.error,
        }
        if with_text:
            row["text"] = self.text
        return row
