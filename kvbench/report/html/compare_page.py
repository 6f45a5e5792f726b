"""The report of ``kvbench compare``: the regression verdict first, then each judged metric with base, head,
their ratio and why it was judged as it was, the two runs' key plots side by side, and both runs' provenance."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvbench import units
from kvbench.report.compare import STATUS_METRIC, Comparison, Row, Verdict
from kvbench.report.compare_render import (
    VERDICT_ORDER,
    format_change,
    format_value,
    policy_line,
    summary_line,
)
from kvbench.report.html.common import draw, figures_block, provenance_facts
from kvbench.report.html.page import Cell, Column, Facts, Page, Section, Table, Text
from kvbench.report.html.page import Verdict as Headline
from kvbench.results.point import Point
from kvbench.results.summary_load import Summary
from kvbench.values import is_number

VERDICT_TONES = {
    Verdict.REGRESSED: "bad",
    Verdict.MISSING: "bad",
    Verdict.IMPROVED: "good",
    Verdict.NEW: "warn",
    Verdict.INFO: "muted",
    Verdict.UNCHANGED: "",
}


def build(comparison: Comparison) -> Page:
    failed = comparison.failed
    kind = comparison.head.kind
    title = f"kvbench compare ({kind}): {'FAIL' if failed else 'PASS'}"
    subtitle = f"base {comparison.base.path} — head {comparison.head.path}"
    badges = ["FAIL" if failed else "PASS"] + (["SIMULATED"] if comparison.simulated else [])
    sections = [headline_section(comparison)]
    figures = draw(lambda: _plot(comparison))
    if figures:
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    sections.append(metrics_section(comparison))
    sections.append(provenance(comparison))
    return Page("compare", title, subtitle, badges, sections)


def ratio(row: Row) -> float | None:
    """head / base for numbers with a non-zero base."""
    if is_number(row.base, finite=True) and is_number(row.head, finite=True) and row.base != 0:
        return float(row.head) / float(row.base)
    return None


def why(row: Row) -> str:
    """How the metric was judged, in words: the rule, a significance test, the note."""
    threshold = row.threshold
    if row.metric == STATUS_METRIC:
        text = "a point's status may not get worse (ok > oom > error)"
    elif threshold == "exact":
        text = "judged exactly: deterministic for the same seed and settings"
    elif threshold.startswith("x"):
        text = f"timing-dependent: judged within {threshold.replace('x', '×', 1)} of base"
    elif threshold == "not gated":
        text = "reported, not gated"
    elif threshold:
        text = f"judged by {threshold}"
    else:
        text = ""
    if row.p_value is not None:
        text += f"; Mann-Whitney U p = {row.p_value:.3g}"
    if row.note:
        text += f"; {row.note}" if text else row.note
    return text


COLUMNS = [
    Column("point", False),
    Column("metric", False),
    Column("base"),
    Column("head"),
    Column("head / base"),
    Column("change"),
    Column("verdict", False),
    Column("why", False),
]


def _row(row: Row) -> list[Cell]:
    r = ratio(row)
    return [
        Cell(row.point.label, row.point.label, field="point"),
        Cell(row.metric, row.metric, field="metric"),
        Cell(format_value(row.base), units.sort_key(row.base), field="base"),
        Cell(format_value(row.head), units.sort_key(row.head), field="head"),
        Cell(units.times(r) if r is not None else units.MISSING, r, field="ratio"),
        Cell(format_change(row), units.sort_key(row.relative_change), field="change"),
        Cell(row.verdict.value, VERDICT_ORDER.index(row.verdict), VERDICT_TONES[row.verdict], "verdict"),
        Cell(why(row), field="why"),
    ]


def _ordered(rows) -> list[Row]:
    return sorted(rows, key=lambda row: VERDICT_ORDER.index(row.verdict))


def headline_section(comparison: Comparison) -> Section:
    failing = comparison.count(Verdict.REGRESSED) + comparison.count(Verdict.MISSING)
    judged = len(comparison.rows)
    if comparison.failed:
        parts = [f"{n} {v.value}" for v in (Verdict.REGRESSED, Verdict.MISSING) if (n := comparison.count(v))]
        headline = f"FAIL: {' and '.join(parts)} of {judged} compared metrics"
    else:
        headline = f"PASS: no regression in {judged} compared metrics"
        if improved := comparison.count(Verdict.IMPROVED):
            headline += f" ({improved} improved)"
    sentences = [
        f"{summary_line(comparison)}.",
        f"{policy_line(comparison)[0].upper()}{policy_line(comparison)[1:]}.",
        f"Base: {comparison.base.path} ({comparison.base.kind}); head: {comparison.head.path} "
        f"({comparison.head.kind}).",
    ]
    sentences += [f"Note: {note}" for note in comparison.notes]
    blocks: list[Any] = [Headline(headline, "bad" if failing else "good", sentences)]
    changed = [
        r
        for r in _ordered(comparison.rows)
        if r.verdict in (Verdict.REGRESSED, Verdict.MISSING, Verdict.IMPROVED, Verdict.NEW)
    ]
    if changed:
        blocks.append(
            Table("What changed beyond its threshold", COLUMNS, [_row(r) for r in changed], id="headline-table")
        )
    else:
        blocks.append(Text(["No metric changed beyond its threshold."], tone="note"))
    return Section("headline", "Verdict", blocks)


def metrics_section(comparison: Comparison) -> Section:
    """Every compared metric, worst first; the unchanged ones in a table drawn closed (a sweep has dozens, each
    judged the same way)."""
    rows = _ordered(comparison.rows)
    judged = [r for r in rows if r.verdict is not Verdict.UNCHANGED]
    unchanged = [r for r in rows if r.verdict is Verdict.UNCHANGED]
    note = (
        "head / base: the ratio of the two values; change: head - base (relative to base). Info rows are reported "
        "but not gated."
    )
    tables = []
    if judged:
        tables.append(
            Table(
                f"{len(judged)} metrics that changed or are only reported, worst verdict first (select a column "
                "heading to sort)",
                COLUMNS,
                [_row(r) for r in judged],
                id="metrics-table",
                note=note,
            )
        )
    if unchanged:
        tables.append(
            Table(
                f"{len(unchanged)} unchanged metrics (select to show)",
                COLUMNS,
                [_row(r) for r in unchanged],
                id="unchanged-table",
                collapsed=True,
            )
        )
    return Section("points", "Every compared metric", tables)


def provenance(comparison: Comparison) -> Section:
    subsections = []
    for name, summary in (("base", comparison.base), ("head", comparison.head)):
        facts = provenance_facts(summary.meta)
        subsections.append(Section(f"provenance-{name}", f"{name.capitalize()}: {summary.path}", [Facts(facts)]))
    return Section("provenance", "Provenance", [], subsections)


# -- plots: the two runs side by side, drawn by the run kinds' own plot functions ----------------------------


def _ok_points(summary: Summary) -> list[Point]:
    """The summary's points that ran their whole load (a point that records no status is not counted as one)."""
    typed = [Point.from_json(p) for p in summary.points.values() if "status" in p]
    return [p for p in typed if p.status == "ok"]


def _plot(comparison: Comparison) -> None:
    """The plots of the compared kind, base next to head (drawn in memory: the names are only labels)."""
    plotter: Callable[[Comparison], Any] | None = _PLOTTERS.get(comparison.head.kind)
    if plotter is not None and comparison.base.kind == comparison.head.kind:
        plotter(comparison)


def _sweep_plot(comparison: Comparison) -> None:
    from kvbench.report import plots

    series = {}
    for name, summary in (("base", comparison.base), ("head", comparison.head)):
        points = _ok_points(summary)
        for engine in sorted({p.engine for p in points}):
            mine = sorted(
                (p for p in points if p.engine == engine and p.output_throughput is not None),
                key=lambda p: p.concurrency,
            )
            if mine:
                series[f"{engine} ({name})"] = ([p.concurrency for p in mine], [p.output_throughput for p in mine])
    if series:
        plots.lines(
            series,
            Path("compare_throughput.png"),
            "Output throughput vs concurrency, base and head",
            "concurrency (requests in flight)",
            "output tokens / s",
            "higher",
        )
    ratios = {}
    for name, summary in (("base", comparison.base), ("head", comparison.head)):
        by_key = {(p.engine, p.concurrency): p for p in _ok_points(summary)}
        levels = sorted(c for engine, c in by_key if engine == "paged" and ("contiguous", c) in by_key)
        throughputs = [
            (c, by_key[("paged", c)].output_throughput, by_key[("contiguous", c)].output_throughput) for c in levels
        ]
        pairs = [
            (c, p / q) for c, p, q in throughputs if is_number(p, finite=True) and is_number(q, finite=True) and q > 0
        ]
        if pairs:
            ratios[name] = ([c for c, _ in pairs], [r for _, r in pairs])
    if ratios:
        plots.lines(
            ratios,
            Path("compare_ratio.png"),
            "Paged / contiguous output throughput (the in-run ratio compare judges), base and head",
            "concurrency (requests in flight)",
            "paged TPS / contiguous TPS",
            "higher",
        )


def _waste_plot(comparison: Comparison) -> None:
    from kvbench.report import plots

    labels, wastes = [], []
    base, head = _ok_points(comparison.base), _ok_points(comparison.head)
    heads = {p.engine: p for p in head}
    for point in base:
        for name, p in (("base", point), ("head", heads.get(point.engine))):
            if p is not None and p.waste:
                labels.append(f"{p.engine}\n{name}")
                wastes.append(p.shares)
    if labels:
        plots.waste_breakdown(
            labels, wastes, Path("compare_waste.png"), "KV pool breakdown per strategy, base and head"
        )


def _bars_plot(metric: str, title: str, ylabel: str, label: Callable[[Point], str]):
    def draw_bars(comparison: Comparison) -> None:
        from kvbench.report import plots

        base: dict[str, Any] = {label(p): p.value(metric) for p in _ok_points(comparison.base)}
        head: dict[str, Any] = {label(p): p.value(metric) for p in _ok_points(comparison.head)}
        names = [n for n in base if is_number(base[n], finite=True) and is_number(head.get(n), finite=True)]
        if names:
            plots.bars(
                names,
                {"base": [base[n] for n in names], "head": [head[n] for n in names]},
                Path(f"compare_{metric}.png"),
                title,
                ylabel,
                "lower",
            )

    return draw_bars


_PLOTTERS: dict[str, Callable[[Comparison], Any]] = {
    "sweep": _sweep_plot,
    "waste": _waste_plot,
    "fleet": _bars_plot(
        "p99_ttft_ms",
        "p99 time to first token per routing policy, base and head",
        "TTFT p99 (ms)",
        lambda p: str(p.extra.get("policy") or p.engine),  # a fleet point's routing policy
    ),
    "share": _bars_plot(
        "mean_blocks",
        "Mean KV blocks per mode, base and head",
        "KV blocks in use",
        lambda p: f"{p.engine} width {p.extra.get('width')}",  # a share point's width
    ),
}
