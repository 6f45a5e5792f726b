"""An engine's running totals of its own steps, by phase: how many, the wall seconds they took and the tokens they
computed. Differences of two readings give a server's step time free of what its requests waited for, which is
what a simulated twin of it needs (a request's time per token also holds the prefills that ran between its
tokens, and the simulator adds those itself)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


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

    def add(self, decode: bool, seconds: float, tokens: int) -> StepTotals:
        """These totals with one more step of ``seconds`` that computed ``tokens``."""
        if decode:
            return replace(
                self,
                decode_steps=self.decode_steps + 1,
                decode_seconds=self.decode_seconds + seconds,
                decode_tokens=self.decode_tokens + tokens,
            )
        return replace(
            self,
            prefill_steps=self.prefill_steps + 1,
            prefill_seconds=self.prefill_seconds + seconds,
            prefill_tokens=self.prefill_tokens + tokens,
        )

    def since(self, earlier: StepTotals) -> StepTotals:
        """The steps between ``earlier`` and these totals."""
        return StepTotals(*(getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)))
