"""An engine's running totals of its own steps, by phase: how many, the wall seconds they took and the tokens they
computed. Differences of two readings give a server's step time free of what its requests waited for, which is
what a simulated twin of it needs (a request's time per token also holds the prefills that ran between its
tokens, and the simulator adds those itself)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

PHASES = ("decode", "prefill")  # the phases a step counts under, as labelled on /metrics


@dataclass(frozen=True)
class StepTotals:
    """Counts since the engine started. A decode step computes one token for each running request; a prefill step
    the prompt tokens of the requests it admits that the prefix cache did not hold. Whole numbers in the engine;
    floats as a scrape reads them."""

    decode_steps: float = 0
    decode_seconds: float = 0.0
    decode_tokens: float = 0
    prefill_steps: float = 0
    prefill_seconds: float = 0.0
    prefill_tokens: float = 0

    @classmethod
    def from_phases(cls, phases: Mapping[str, tuple[float, float, float]]) -> StepTotals:
        """From (steps, seconds, tokens) of each phase."""
        return cls(*phases["decode"], *phases["prefill"])

    def phase(self, name: str) -> tuple[float, float, float]:
        """(steps, seconds, tokens) of the phase ``name``."""
        if name == "decode":
            return self.decode_steps, self.decode_seconds, self.decode_tokens
        return self.prefill_steps, self.prefill_seconds, self.prefill_tokens

    def add(self, decode: bool, seconds: float, tokens: int) -> StepTotals:
        """These totals with one more step of ``seconds`` that computed ``tokens`` (once per engine step: built
        directly, not through ``dataclasses.replace``)."""
        steps, spent, computed = self.phase("decode" if decode else "prefill")
        counted = (steps + 1, spent + seconds, computed + tokens)
        return StepTotals(*counted, *self.phase("prefill")) if decode else StepTotals(*self.phase("decode"), *counted)

    def since(self, earlier: StepTotals) -> StepTotals:
        """The steps between ``earlier`` and these totals."""
        return StepTotals(*(getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)))
