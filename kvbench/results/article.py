"""The article's table, typed: at each concurrency, each engine's output throughput (or why it has none) and paged
against contiguous: the throughput ratio and the KV memory saved at peak. ``summary.json`` keeps it as
``article_table``, one flat row per concurrency (:meth:`ArticleRow.to_json`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvbench.values import is_positive

COMPARED = ("contiguous", "paged")  # the engines the table compares, in its order
REFERENCE_ENGINES = {"vllm": "vLLM"}  # external engines shown as a reference column (their own kernels and scheduler)


@dataclass(frozen=True)
class EngineFigures:
    """One engine at one concurrency."""

    status: str  # ok | oom | error
    tps: float | None  # output tokens/s over the whole point
    tps_ci95: float | None = None  # with --repeat: the 95% confidence interval's half-width
    steady_tps: float | None = None  # while all requests were in flight (None: no such window, or a reference)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class ArticleRow:
    concurrency: int
    engines: dict[str, EngineFigures] = field(default_factory=dict)  # the engines that ran at this concurrency
    gain_pct: float | None = None  # paged over contiguous output throughput, in % (both ok)
    kv_memory_reduction_pct: float | None = None  # KV memory paging saved at peak, % of contiguous's
    paged_over_contiguous_tps: float | None = None

    def figures(self, engine: str) -> EngineFigures | None:
        return self.engines.get(engine)

    def status(self, engine: str) -> str | None:
        figures = self.engines.get(engine)
        return figures.status if figures else None

    @property
    def repeated(self) -> bool:
        """Whether the row carries a spread over repeats (``--repeat`` 2 or more)."""
        return any(figures.tps_ci95 is not None for figures in self.engines.values())

    def to_json(self) -> dict[str, Any]:
        """The flat form ``summary.json`` holds: compared engines' fields always (None where one did not run), their
        spread and steady throughput where it ran, then each reference engine that ran."""
        out: dict[str, Any] = {"concurrency": self.concurrency}
        for engine in COMPARED:
            figures = self.engines.get(engine)
            out[f"{engine}_tps"] = figures.tps if figures else None
            out[f"{engine}_status"] = figures.status if figures else None
        out |= {
            "gain_pct": self.gain_pct,
            "kv_memory_reduction_pct": self.kv_memory_reduction_pct,
            "paged_over_contiguous_tps": self.paged_over_contiguous_tps,
        }
        for engine in COMPARED:
            figures = self.engines.get(engine)
            if figures:
                out[f"{engine}_tps_ci95"] = figures.tps_ci95
                out[f"{engine}_steady_tps"] = figures.steady_tps
        for engine in REFERENCE_ENGINES:
            figures = self.engines.get(engine)
            if figures:
                out |= {f"{engine}_status": figures.status, f"{engine}_tps": figures.tps}
                out[f"{engine}_tps_ci95"] = figures.tps_ci95
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArticleRow:
        engines = {
            engine: EngineFigures(
                data[f"{engine}_status"],
                data.get(f"{engine}_tps"),
                data.get(f"{engine}_tps_ci95"),
                data.get(f"{engine}_steady_tps"),
            )
            for engine in (*COMPARED, *REFERENCE_ENGINES)
            if data.get(f"{engine}_status") is not None
        }
        return cls(
            data["concurrency"],
            engines,
            data.get("gain_pct"),
            data.get("kv_memory_reduction_pct"),
            data.get("paged_over_contiguous_tps"),
        )


def article_rows(points: Sequence[Mapping[str, Any]]) -> list[ArticleRow]:
    """Per concurrency: each engine's throughput (or its status), and paged against contiguous where both ran
    their whole load and contiguous measured a throughput and its KV memory."""
    by_key = {(p["engine"], p["concurrency"]): p for p in points}
    rows = []
    for concurrency in sorted({p["concurrency"] for p in points}):
        engines = {}
        for engine in (*COMPARED, *REFERENCE_ENGINES):
            point = by_key.get((engine, concurrency))
            if point:
                engines[engine] = EngineFigures(
                    point["status"],
                    point.get("output_throughput"),
                    point.get("output_throughput_ci95"),
                    point.get("steady_output_throughput") if engine in COMPARED else None,
                )
        paged, contiguous = by_key.get(("paged", concurrency)), by_key.get(("contiguous", concurrency))
        row = ArticleRow(concurrency, engines)
        if (
            paged
            and contiguous
            and paged["status"] == contiguous["status"] == "ok"
            and is_positive(contiguous.get("output_throughput"))
            and is_positive(contiguous.get("kv_peak_allocated_bytes"))
        ):
            ratio = paged["output_throughput"] / contiguous["output_throughput"]
            reduction = 100 * (1 - paged["kv_peak_allocated_bytes"] / contiguous["kv_peak_allocated_bytes"])
            row = ArticleRow(concurrency, engines, 100 * (ratio - 1), reduction, ratio)
        rows.append(row)
    return rows
