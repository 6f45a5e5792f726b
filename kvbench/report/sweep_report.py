"""The sweep's tables (article-shaped and detailed), summary files and plots."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from rich.table import Table

from kvbench.report.columns import Col, TableSpec, print_whole
from kvbench.report.run_input import read_run_json
from kvbench.report.rundir import flatten, write_summary, wrote_line
from kvbench.report.sweep_verdict import REFERENCE_CAPTION, per_cpu_second, references, sweep_verdict
from kvbench.report.waterfall import waterfall_levels, waterfall_plot, waterfall_plot_name
from kvbench.results.article import REFERENCE_ENGINES, ArticleRow, article_rows
from kvbench.results.block_timeline import BlockTimeline
from kvbench.results.point import Point, oom_text, with_figures_hidden
from kvbench.results.run_meta import RunMeta
from kvbench.results.sweep_summary import SweepSummary
from kvbench.units import human_bytes, ms_text, num, pct, recorded
from kvbench.values import is_positive

TIE_PCT = 2.0  # a throughput gain within this many percent is called "on par" (simulated, or beyond the CIs)


def distinguishable(row: ArticleRow, simulated: bool) -> bool | None:
    """Whether a throughput gain can be told from noise: simulated runs are exact; repeated points have 95%
    confidence intervals; a single measured run cannot say (None)."""
    paged, contiguous = row.figures("paged"), row.figures("contiguous")
    if row.gain_pct is None or paged is None or contiguous is None or paged.tps is None or contiguous.tps is None:
        return None
    if simulated:
        return abs(row.gain_pct) >= TIE_PCT
    if paged.tps_ci95 is None or contiguous.tps_ci95 is None:
        return None
    return abs(paged.tps - contiguous.tps) > paged.tps_ci95 + contiguous.tps_ci95


def _tps_text(engine: str) -> Callable[[ArticleRow], str]:
    def text(row: ArticleRow) -> str:
        figures = row.figures(engine)
        if figures is None:
            return "-"
        if not figures.ok:
            return "OOM" if figures.status == "oom" else figures.status
        spread = f" ± {figures.tps_ci95:,.1f}" if figures.tps_ci95 else ""
        return "-" if figures.tps is None else f"{figures.tps:,.1f}{spread}"

    return text


def _steady_text(engine: str) -> Callable[[ArticleRow], str]:
    def text(row: ArticleRow) -> str:
        figures = row.figures(engine)
        if figures is None or figures.status == "error":
            return "-"
        if figures.status == "oom":
            return "OOM"
        return "no window" if figures.steady_tps is None else f"{figures.steady_tps:,.1f}"

    return text


def _status_tone(engine: str) -> Callable[[ArticleRow], str]:
    def tone(row: ArticleRow) -> str:
        status = row.status(engine)
        return "muted" if status is None else "" if status == "ok" else "bad"

    return tone


def _tps_sort(engine: str, steady: bool = False) -> Callable[[ArticleRow], float | None]:
    """Ordered by the figure; an engine that ran out of memory or failed first, one that did not run last."""

    def sort(row: ArticleRow) -> float | None:
        figures = row.figures(engine)
        if figures is None:
            return None
        if not figures.ok:
            return -1.0
        value = figures.steady_tps if steady else figures.tps
        return value if is_positive(value) else None

    return sort


def _gain_text(row: ArticleRow) -> str:
    gain = row.gain_pct
    return "-" if gain is None else "0%" if round(gain) == 0 else f"{gain:+.0f}%"


def article_spec(rows: Sequence[ArticleRow], simulated: bool) -> TableSpec[ArticleRow]:
    """The article's table, as the console, summary.md and report.html show it: each engine's output
    throughput at each concurrency, paged against contiguous, and the steady throughput."""

    def gain_tone(row: ArticleRow) -> str:  # coloured only where the gain is told from noise
        judged = distinguishable(row, simulated)
        return "" if not judged or row.gain_pct is None else "good" if row.gain_pct > 0 else "bad"

    shown_references = references(rows)
    qualifiers = ([] if simulated else ["measured"]) + (
        ["± is the 95% CI over repeats"] if any(row.repeated for row in rows) else []
    )
    caption = (
        "TPS: output tokens/s over the whole point; steady: while all C requests were in flight (ramp-up and "
        "draining tail left out). OOM: the engine rejected requests for lack of KV memory"
        + (f". {REFERENCE_CAPTION}" if shown_references else "")
    )
    columns: list[Col[ArticleRow]] = [
        Col("concurrency", lambda r: str(r.concurrency), "concurrency", key=True, sort=lambda r: r.concurrency),
        *(
            Col(f"{e} TPS", _tps_text(e), f"{e}_tps", sort=_tps_sort(e), tone=_status_tone(e))
            for e in ("contiguous", "paged")
        ),
        Col("gain %", _gain_text, "gain_pct", sort=lambda r: r.gain_pct, tone=gain_tone),
        Col(
            "KV memory reduction",
            lambda r: pct(r.kv_memory_reduction_pct, 0, missing="-"),
            "kv_memory_reduction_pct",
            sort=lambda r: r.kv_memory_reduction_pct,
        ),
        Col(
            "paged/contiguous",
            lambda r: "-" if r.paged_over_contiguous_tps is None else f"{r.paged_over_contiguous_tps:.2f}x",
            "paged_over_contiguous_tps",
            wide=True,
            sort=lambda r: r.paged_over_contiguous_tps,
        ),
        *(
            Col(
                f"steady TPS {e}",
                _steady_text(e),
                f"{e}_steady_tps",
                sort=_tps_sort(e, steady=True),
                tone=_status_tone(e),
            )
            for e in ("contiguous", "paged")
        ),
        *(
            Col(f"{REFERENCE_ENGINES[e]} TPS (reference)", _tps_text(e), f"{e}_tps", sort=_tps_sort(e))
            for e in shown_references
        ),
    ]
    title = "Paged vs contiguous at each concurrency" + (f" ({'; '.join(qualifiers)})" if qualifiers else "")
    title += " — SIMULATED" if simulated else ""
    return TableSpec(title, tuple(columns), caption)


def article_table(rows: Sequence[ArticleRow], simulated: bool) -> Table:
    """The article's table on the console."""
    return article_spec(rows, simulated).rich(rows)


def _engine_label(point: Point) -> str:
    return f"{point.engine} (reference)" if point.engine in REFERENCE_ENGINES else point.engine


def _waste_shares(point: Point) -> str:
    w = point.shares
    return f"{w.token_state_pct:.0f}/{w.reservation_pct:.0f}/{w.internal_pct:.0f}/{w.external_pct:.0f}"


def _steady_window(point: Point) -> str:
    window = point.steady_window_s
    return "-" if window is None else f"{window:,.2f} s, {point.steady_window_pct or 0:.0f}%"


def _cpu_second_text(point: Point) -> str:
    rate = per_cpu_second(point)
    return f"{rate:,.0f}" if rate else "-"


def _latency(first: str, second: str, kind: str) -> Callable[[Point], str]:
    def text(point: Point) -> str:
        """Two latency statistics of ``kind`` in ms, e.g. ``0.412/0.631`` for p50/p99 of TPOT."""
        a, b = point.latencies.get(f"{first}_{kind}_ms"), point.latencies.get(f"{second}_{kind}_ms")
        return "-" if a is None or b is None else f"{ms_text(a)}/{ms_text(b)}"

    return text


POINT_TABLE: TableSpec[Point] = TableSpec(
    "Per point (TPS = output tokens/s; latencies in ms; waste = % of pool, time-averaged)",
    (
        Col("engine", _engine_label, "engine", key=True, figure=False, numeric=False),
        Col("C", lambda p: str(p.concurrency), "concurrency", key=True, figure=False),
        Col("done/rej", lambda p: f"{p.completed}/{p.rejected}", "completed", figure=False),
        Col("out TPS", lambda p: f"{p.output_throughput:,.0f}", "output_throughput", "out\nTPS"),
        Col(
            "steady TPS",
            lambda p: num(p.steady_output_throughput, 0, missing="no window"),
            "steady_output_throughput",
            "steady\nTPS",
        ),
        Col("TTFT p50/p99", _latency("p50", "p99", "ttft"), "p99_ttft_ms", "TTFT\np50/p99"),
        Col("TPOT p50/p99", _latency("p50", "p99", "tpot"), "p99_tpot_ms", "TPOT\np50/p99"),
        Col("peak run", lambda p: str(p.peak_running), "peak_running", "peak\nrun", figure=False),
        Col(
            "used/res/int/ext %",
            _waste_shares,
            "waste",
            "used/res/\nint/ext %",
            figure=False,
            sort=lambda p: p.shares.token_state_pct,
        ),
        Col("steady window", _steady_window, "steady_window_s", "steady\nwindow", wide=True),
        Col("tok/CPU-s", _cpu_second_text, "", "out tok/\nCPU-s", wide=True, sort=per_cpu_second),
        Col("TTFT mean/std", _latency("mean", "std", "ttft"), "mean_ttft_ms", "TTFT\nmean/std", wide=True),
        Col("TPOT mean/std", _latency("mean", "std", "tpot"), "mean_tpot_ms", "TPOT\nmean/std", wide=True),
        Col("ITL p50/p99", _latency("p50", "p99", "itl"), "p99_itl_ms", "ITL\np50/p99", wide=True),
        Col("E2EL p50/p99", _latency("p50", "p99", "e2el"), "p99_e2el_ms", "E2EL\np50/p99", wide=True, page=True),
        Col("preempt", lambda p: str(p.preemptions), "preemptions", wide=True, page=True, figure=False),
        Col(
            "KV peak",
            lambda p: human_bytes(p.kv_peak_allocated_bytes),
            "kv_peak_allocated_bytes",
            "KV\npeak",
            wide=True,
            page=True,
            figure=False,
        ),
        Col("frag", lambda p: f"{p.fragmentation_mean:.2f}", "fragmentation_mean", wide=True, page=True, figure=False),
    ),
    narrow_caption="more columns (mean/std, ITL, E2EL, tok per CPU-s, preemptions): summary.md, wide table",
)
POINT_TABLE_NOTE = (
    "C: requests in flight; done/rej: requests completed and rejected. Steady TPS: while all C were in flight, "
    "with that window's length and share of the run. TTFT: time to first token; TPOT: time per output token after "
    "the first; ITL: between tokens; E2EL: end to end. used/res/int/ext: the KV pool's token states, reservation, "
    "internal and external fragmentation, time-averaged shares; frag: 1 - used / allocated. A point that ran out "
    "of KV memory (OOM) or failed shows no throughput or latency: they would describe a lighter load."
)


def steady_warnings(points: Sequence[Point]) -> list[str]:
    """Points whose full-load window is missing or short: their whole-run TPS is mostly ramp-up and tail."""
    lines = []
    ok = [p for p in points if p.status == "ok"]  # an OOM point's answer is OOM, not a throughput
    missing = [p for p in ok if p.steady_output_throughput is None]
    if missing:
        names = ", ".join(f"{p.engine} C={p.concurrency} ({p.completed + p.rejected} requests)" for p in missing)
        lines.append(
            f"no steady window at {names}: the closed loop never held all its requests in flight (fewer "
            "requests than the concurrency); send more requests per point"
        )
    short = [(p, p.steady_window_pct) for p in ok if p.steady_window_pct is not None and p.steady_window_pct < 25]
    if short:
        names = ", ".join(f"{p.engine} C={p.concurrency} ({pct:.0f}%)" for p, pct in short)
        lines.append(
            f"short steady window at {names}: the whole-run TPS there is mostly ramp-up and draining tail; "
            "compare the steady TPS, or send more requests per point"
        )
    return lines


def output_length_title(meta: RunMeta) -> str:
    if meta.stop == "eos":
        how = "ending at EOS at each reference length (simulated)" if meta.simulated else "decided by the model (EOS)"
    else:
        how = "drawn or reference, EOS ignored"
    return f"Output lengths {how}, and the KV memory they left unused"


def _lengths_text(p: Point) -> str:
    return (
        f"{p.output_len_mean or 0:,.0f} / {p.output_len_p50 or 0:,.0f} / {p.output_len_p90 or 0:,.0f} / "
        f"{p.output_len_max or 0:,}"
    )


def _oracle_peak(p: Point) -> int | None:
    value = p.extra.get("kv_hindsight_oracle_peak_bytes")
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


OUTPUT_LENGTH_TABLE: TableSpec[Point] = TableSpec(
    "Output lengths",  # each run's title and caption: output_length_spec
    (
        Col("engine", lambda p: p.engine, "engine", key=True, numeric=False, sort=lambda p: p.engine),
        Col("C", lambda p: str(p.concurrency), "concurrency", key=True, sort=lambda p: p.concurrency),
        Col("output len mean/p50/p90/max", _lengths_text, "output_len_mean", sort=lambda p: p.output_len_mean),
        Col(
            "ended at EOS",
            lambda p: f"{p.stopped_at_eos}/{p.completed}",
            "stopped_at_eos",
            sort=lambda p: p.stopped_at_eos,
        ),
        Col(
            "internal %",
            lambda p: f"{p.shares.internal_pct:.1f}",
            "waste.internal_pct",
            sort=lambda p: p.shares.internal_pct,
        ),
        Col(
            "KV peak",
            lambda p: human_bytes(p.kv_peak_allocated_bytes or 0),
            "kv_peak_allocated_bytes",
            sort=lambda p: p.kv_peak_allocated_bytes,
        ),
        Col(
            "hindsight oracle KV peak",
            lambda p: "-" if (peak := _oracle_peak(p)) is None else f"{human_bytes(peak)} (not runnable)",
            "kv_hindsight_oracle_peak_bytes",
            sort=_oracle_peak,
        ),
    ),
)


def output_length_spec(meta: RunMeta, caption: str | None = None) -> TableSpec[Point]:
    """The output lengths that occurred (EOS-decided in an eos run) next to the memory they left unused, as the
    console, summary.md and the page show them; ``caption`` replaces the sweep's note on how the contiguous
    baseline reserves."""
    return replace(OUTPUT_LENGTH_TABLE, title=output_length_title(meta), caption=caption or _reservation_caption(meta))


def with_output_lengths(points: Sequence[Point]) -> list[Point]:
    """The points that measured their output lengths (an error point measured nothing)."""
    return [p for p in points if p.status != "error" and p.output_len_mean is not None]


def output_length_table(points: Sequence[Point], meta: RunMeta, caption: str | None = None) -> Table:
    return output_length_spec(meta, caption).rich(with_output_lengths(points))


def _reservation_caption(meta: RunMeta) -> str:
    max_len, reserve = meta.max_len, meta.reserve_policy
    if meta.stop == "eos":
        plan = f"max-len {max_len}" if reserve == "max" else f"the next power of two of max-len {max_len}"
        return (
            f"The contiguous baseline cannot know where an answer ends: it reserves {plan} per request "
            "(prompt + max_tokens). Hindsight oracle: slabs of exactly each real length, in the same schedule, "
            "a bound no engine reaches."
        )
    return f"The contiguous baseline reserves by policy {reserve} (max-len {max_len})."


def shows_output_lengths(meta: RunMeta) -> bool:
    """Runs whose lengths came from the model or from real data show what occurred (table and plot)."""
    return meta.stop == "eos" or meta.dataset is not None


def print_sweep(
    console,
    points: list[dict],
    simulated: bool,
    waterfall: bool,
    run_dir: Path,
    meta: RunMeta | None = None,
    wide: bool = False,
) -> None:
    """The article-shaped table and its finding in words, the per-point table (``wide``: every column), the
    output lengths of a real workload, warnings about missing or short steady windows and, when asked, every
    point's memory waterfall."""
    rows, typed = article_rows(points), [Point.from_json(p) for p in points]
    print_whole(console, article_table(rows, simulated))
    verdict = sweep_verdict(rows, typed, meta)
    console.print(f"[bold]{verdict.headline}[/bold]")
    for line in verdict.sentences:
        console.print(line)
    print_whole(console, POINT_TABLE.rich(typed, wide))
    if meta is not None and shows_output_lengths(meta):
        console.print(output_length_table(typed, meta))
    for line in steady_warnings(typed):
        console.print(f"[yellow]warning: {line}[/yellow]")
    if waterfall:
        from kvbench.report.waterfall import waterfall_table

        for point in points:
            if point.get("waterfall"):  # the levels the waterfall module reads from the point
                console.print(waterfall_table(point))
    console.print(wrote_line(run_dir, "summary.json, summary.csv, summary.md, results.jsonl, *.png"))


def scenarios_table(scenarios: dict) -> Table:
    table = Table(title="Built-in scenarios (by name, or a TOML file of your own)")
    table.add_column("name")
    table.add_column("description")
    for name, scenario in scenarios.items():
        table.add_row(name, scenario.description)
    return table


def write_outputs(run_dir: Path, run: RunMeta, points: list[dict]) -> dict:
    for point in points:  # the memory waterfall of every measured point (additive field)
        if Point.from_json(point).status != "error":
            levels = waterfall_levels(point, "simulated" if run.simulated else None)
            point["waterfall"] = [level.to_json() for level in levels]
    rows, typed = article_rows(points), [Point.from_json(p) for p in points]
    verdict = sweep_verdict(rows, typed, run)
    document = SweepSummary(run, points, rows, verdict.lines).to_json()
    simulated = run.simulated
    md = [
        f"# kvbench sweep{' (simulated)' if simulated else ''}\n\n{run.scenario_description}\n\n"
        f"KV budget: {run.budget_source}\n\n"
    ]
    if run.stop_description:
        md.append(f"Stop: {run.stop_description}\n\n")
    spec = article_spec(rows, simulated)
    md.append(spec.markdown(rows))
    md.append(f"\n{spec.caption}.\n")
    md.append(f"\n**{verdict.headline}**\n\n" + "".join(f"{line}\n\n" for line in verdict.sentences).rstrip() + "\n")
    md.append(f"\n## {POINT_TABLE.title}\n\n")
    md.append(POINT_TABLE.markdown(typed))
    write_summary(run_dir, document, [flatten(with_figures_hidden(p)) for p in points], "".join(md))
    write_plots(run_dir, run, points)
    return document


def _plot_label(engine: str) -> str:
    return f"{engine} (reference)" if engine in REFERENCE_ENGINES else engine


def plot_series(points: Sequence[Point]) -> tuple[dict, dict, dict]:
    """What throughput.png and latency.png draw: throughput {engine: (concurrency, TPS)}, latency
    {panel: {"engine p50": (concurrency, ms)}} and the OOM marks {engine: [(concurrency, text)]}. Only ok
    points are drawn; an OOM point is a mark, never a point on a line."""
    series: dict[str, tuple[list, list]] = {}
    latency: dict[str, dict] = {"time to first token (TTFT)": {}, "time per output token (TPOT)": {}}
    marks: dict[str, list[tuple[float, str]]] = {}
    for engine in sorted({p.engine for p in points}):
        label = _plot_label(engine)
        mine = sorted((p for p in points if p.engine == engine), key=lambda p: p.concurrency)
        shown = [p for p in mine if p.status == "ok"]
        series[label] = ([p.concurrency for p in shown], [p.output_throughput for p in shown])
        timed = [p for p in shown if p.latencies.get("p50_tpot_ms") is not None]
        for stat in ("p50", "p99"):
            xs = [p.concurrency for p in timed]
            for panel, kind in (("time to first token (TTFT)", "ttft"), ("time per output token (TPOT)", "tpot")):
                latency[panel][f"{label} {stat}"] = (xs, [p.latencies[f"{stat}_{kind}_ms"] for p in timed])
        oom: list[tuple[float, str]] = [
            (p.concurrency, f"OOM ({p.rejected:,} rejected)") for p in mine if p.status == "oom"
        ]
        if oom:
            marks[label] = oom
    return series, latency, marks


def write_plots(run_dir: Path, run: RunMeta, points: list[dict]) -> None:
    """The sweep's PNG plots, from its points and the timeline files in ``run_dir`` (the HTML report draws the
    same figures into memory)."""
    from kvbench.report import plots  # matplotlib loads only when plots are drawn

    measured = [(typed, point) for point in points if (typed := Point.from_json(point)).status != "error"]
    if not measured:
        return
    ok = [typed for typed, _ in measured]
    tag = f"{recorded(run.model_name)} on {recorded(run.device)}, scenario {recorded(run.scenario)}"
    tag += " — SIMULATED" if run.simulated else ""
    engines = sorted({p.engine for p in ok})
    series, latency_series, marks = plot_series(ok)
    plots.lines(
        series,
        run_dir / "throughput.png",
        f"Output throughput vs concurrency\n{tag}",
        "concurrency (requests in flight)",
        "output tokens / s",
        "higher",
        marks=marks,
        from_zero=True,
    )
    plots.line_panels(
        latency_series,
        run_dir / "latency.png",
        f"Latency vs concurrency (p50 solid, p99 dashed) — {tag}",
        "concurrency (requests in flight)",
        "latency (ms)",
        "lower",
        marks=marks,
    )
    ordered = sorted(measured, key=lambda pair: (pair[0].concurrency, pair[0].engine))
    plots.waste_breakdown(
        [f"{p.engine}\nC={p.concurrency}" for p, _ in ordered],
        [p.shares for p, _ in ordered],
        run_dir / "memory.png",
        "KV memory breakdown per point",
        tag,
        marks=[None if p.status == "ok" else "OOM" for p, _ in ordered],
    )
    for _, point in ordered:  # the waterfall module reads the point's levels from its JSON form
        waterfall_plot(point, run_dir / waterfall_plot_name(point), tag)
    top = max(p.concurrency for p in ok)
    if shows_output_lengths(run):
        at_top = {p.engine: p for p in ok if p.concurrency == top}
        if at_top:
            plots.output_lengths_and_waste(
                at_top,
                run_dir / "output_lengths.png",
                f"Output lengths that occurred and the KV memory they left unused, C={top}\n{tag}",
                run.stop,
                run.max_len,
                run.simulated,
            )
    timelines, total_blocks = {}, None
    for engine in engines:
        reference = next((p.extra.get("reference") or {} for p in ok if p.engine == engine), {})
        if reference.get("block_size", run.block_size) != run.block_size:
            continue  # blocks of another size are not comparable on one axis
        data = read_run_json(run_dir, f"timeline-{engine}-c{top}.json")
        if data is not None:
            timeline = BlockTimeline.from_json(data)
            if engine not in REFERENCE_ENGINES or total_blocks is None:  # the pool of kvbench's own engines
                total_blocks = timeline.total_blocks
            at = next((p for p in ok if p.engine == engine and p.concurrency == top), None)
            shown = at is not None and at.status == "ok"
            label = _plot_label(engine) + ("" if shown else f" ({oom_text(at.to_json() if at else {})})")
            timelines[label] = (timeline.times, timeline.blocks)
    if timelines:
        plots.lines(
            timelines,
            run_dir / "blocks_over_time.png",
            f"KV blocks in use over time at concurrency {top}, in a pool of {total_blocks:,} blocks\n{tag}",
            "time since start of the point (s)",
            "blocks in use",
            "the same work in fewer blocks is better",
            markers=False,
            hline=total_blocks,
            from_zero=True,
        )
