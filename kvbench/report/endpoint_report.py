"""The report of ``sweep --target``: servers over HTTP side by side at each load level.

A point measured over HTTP knows the server's KV usage as a share of its cache (``kv_usage_peak``/``_mean`` in
[0, 1]), not in bytes: its tables show KV usage in %, its waste and byte columns are left out. A level is a
concurrency (``C=8``) or, in an open loop, a request rate (``2 req/s``). The plots: output throughput and
latency against the level per target, the server's KV usage against the level, and per point its timeline
(client output tok/s and server KV usage on one time axis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from kvbench.fileio import run_file
from kvbench.report.columns import Col, TableSpec, markdown_table, print_whole
from kvbench.report.progress import sweep_progress_bars
from kvbench.report.run_input import read_run_json
from kvbench.report.rundir import flatten, write_summary, wrote_line
from kvbench.results.endpoint_figures import EndpointFigures, slo_share
from kvbench.results.endpoint_timeline import EndpointTimeline
from kvbench.results.find_max_search import EndpointSummary, Search
from kvbench.results.point import Point
from kvbench.results.prefix_reuse_figures import PrefixReuse
from kvbench.results.run_meta import RunMeta
from kvbench.results.sweep_summary import SweepSummary
from kvbench.units import count, ms_text, recorded, share, share_number
from kvbench.values import printable

FIND_MAX_COLUMNS = (
    "target",
    "highest load meeting the SLO",
    "first load missing it",
    "limited by",
    "evidence",
    "what to change on the server",
)


def level_of(point: Point) -> float:
    rate = EndpointFigures.of(point).request_rate
    return float(point.concurrency) if rate is None else float(rate)


def level_text(point: Point) -> str:
    figures = EndpointFigures.of(point)
    if figures.pattern == "trace":
        return "trace"
    rate = figures.request_rate
    return f"C={point.concurrency}" if rate is None else f"{rate:g} req/s"


def level_axis(points: Sequence[Point]) -> str:
    return (
        "request rate (requests / s)"
        if any(EndpointFigures.of(p).request_rate is not None for p in points)
        else "concurrency (requests in flight)"
    )


def ordered(points: Sequence[Point]) -> list[Point]:
    return sorted(points, key=lambda p: (level_of(p), p.engine))


def _pair(point: Point, kind: str) -> str:
    a, b = point.latencies.get(f"p50_{kind}_ms"), point.latencies.get(f"p99_{kind}_ms")
    return "-" if a is None or b is None else f"{ms_text(a)}/{ms_text(b)}"


def _done(p: Point) -> str:
    figures = EndpointFigures.of(p)
    stopped = figures.stopped  # cut by the point's time limit: neither done nor failed
    return f"{p.completed:g}/{figures.failed}" + (f" +{stopped} cut" if stopped else "")


def _output_tps(p: Point) -> str:
    if not p.completed:
        return "-"
    spread = p.ci95("output_throughput")  # --repeat: the 95% CI over the runs
    return f"{p.output_throughput:,.0f}" + (f" ± {spread:,.0f}" if spread else "")


def _slo_met(p: Point) -> str:
    return share(slo_share(p), 0, missing="-")


def _kv_usage(p: Point) -> str:
    server = EndpointFigures.of(p).server
    return f"{share_number(server.kv_usage_peak, 0, missing='-')}/{share_number(server.kv_usage_mean, 0, missing='-')}"


def _running_waiting(p: Point) -> str:
    return f"{count(p.peak_running, missing='-')}/{count(EndpointFigures.of(p).server.waiting_peak, missing='-')}"


POINT_TABLE: TableSpec[Point] = TableSpec(
    "Servers over HTTP (TPS = output tokens/s; latencies in ms; KV usage = % of the server's KV cache)",
    (
        Col("target", lambda p: p.engine, "engine", key=True, figure=False, numeric=False),
        Col("load", level_text, "concurrency", key=True, figure=False, numeric=False, sort=level_of),
        Col("done/fail", _done, "completed", figure=False),
        Col("out TPS", _output_tps, "output_throughput"),
        Col("req/s", lambda p: f"{p.request_throughput:,.2f}", "request_throughput"),
        Col("TTFT p50/p99", lambda p: _pair(p, "ttft"), "p99_ttft_ms"),
        Col("TPOT p50/p99", lambda p: _pair(p, "tpot"), "p99_tpot_ms"),
        Col("E2EL p50", lambda p: ms_text(p.latencies.get("p50_e2el_ms")), "p50_e2el_ms"),
        Col("SLO met", _slo_met, "request_goodput"),
        Col("KV % peak/mean", _kv_usage, "kv_usage_peak", figure=False),
        Col("preempt", lambda p: count(p.preemptions, missing="-"), "preemptions", figure=False),
        Col("run/wait", _running_waiting, "peak_running", figure=False),
        Col(
            "prefix hit %",
            lambda p: share_number(EndpointFigures.of(p).server.prefix_cache_hit_rate, 0, missing="-"),
            "prefix_cache_hit_rate",
            figure=False,
        ),
    ),
    caption="SLO met: share of completed requests meeting every objective (goodput / throughput); "
    "run/wait: peak requests running and waiting on the server; +N cut: requests the point's time limit "
    "stopped before they ended; '-': not measured (no SLO "
    "given, or the server does not expose it); for a repeated point, done is the mean over the runs, failed their "
    "sum, and ± the 95% CI of output tok/s",
    partial_errors=True,
)


def find_max_rows(searches: Sequence[Search]) -> list[list[str]]:
    rows = []
    for s in searches:
        limit = s.limit
        best = "none" if s.best is None else s.level_text(s.best)
        miss = "-" if s.first_miss is None else s.level_text(s.first_miss)
        rows.append(
            [
                s.engine,
                best,
                miss,
                limit.kind if limit else "-",
                (limit.evidence if limit else "") or s.stopped,
                limit.suggestion if limit else "-",
            ]
        )
    return rows


def find_max_table(searches: Sequence[Search], slo: dict[str, Any] | None) -> Table:
    objectives = ", ".join(f"{k} <= {v:g} ms" for k, v in (slo or {}).items())
    table = Table(title=f"The highest load meeting the SLO ({objectives})")
    for column in FIND_MAX_COLUMNS:
        table.add_column(column, overflow="fold")
    for row in find_max_rows(searches):
        table.add_row(*row)
    return table


def findings(points: Sequence[Point]) -> list[str]:
    """What the points say in words: the best throughput per target, KV saturation, failures, agreement."""
    lines = []
    for engine in sorted({p.engine for p in points}):
        mine = [p for p in points if p.engine == engine and p.completed]
        if not mine:
            continue
        best = max(mine, key=lambda p: p.output_throughput)
        line = f"{engine}: at most {best.output_throughput:,.0f} output tok/s (at {level_text(best)})"
        full = [p for p in mine if (EndpointFigures.of(p).server.kv_usage_peak or 0) >= 0.95]
        if full:
            line += f"; its KV cache was full (>= 95%) from {level_text(full[0])}"
        preempted = [p for p in mine if (p.preemptions or 0) > 0]
        if preempted:
            line += f", preempting from {level_text(preempted[0])}"
        lines.append(line + ".")
    for p in points:
        lines += reuse_lines(p)
        agreement = EndpointFigures.of(p).agreement
        for kind, verb in (("output", "generating"), ("input", "prefilling")):
            ratio = agreement.tokens_client_over_server(kind)
            if ratio is not None and abs(ratio - 1) > 0.01:
                lines.append(
                    f"{p.engine} {level_text(p)}: the client counted {ratio:.3f}x the {kind} tokens the "
                    f"server reports {verb} (another workload on the server, or tokens counted differently)"
                )
    return lines


def reuse_lines(point: Point) -> list[str]:
    """A point's prefix reuse in words: the requests' hit rate beside the counters' and the workload's ideal, and
    what the server's KV events say of eviction; each flag as its own line."""
    lines = []
    figures = EndpointFigures.of(point)
    reuse = figures.prefix_reuse or PrefixReuse()
    where = f"{point.engine} {level_text(point)}"
    rate = reuse.hit_rate_requests
    if rate is not None:
        line = f"{where}: the answers report {rate:.1%} of prompt tokens served from the prefix cache"
        counters = reuse.hit_rate_counters
        if counters is not None:
            line += f" (the server's counters: {counters:.1%})"
        ideal = reuse.workload.ideal_hit_rate if reuse.workload else None
        if ideal is not None:
            line += f"; an unbounded cache starting empty would serve {ideal:.1%} of the same requests' prompt tokens"
            if figures.cache_state != "reset" and rate > ideal + 0.01:
                line += " (this point's cache was not emptied first: it reused what earlier points left)"
        lines.append(line + ".")
    target = reuse.target
    if target is not None and target.achieved is not None:
        verdict = "met" if target.met else "MISSED"
        lines.append(
            f"{where}: target hit rate {target.rate:.1%} {verdict}: achieved {target.achieved:.1%} "
            f"(planned {target.planned:.1%} in blocks of {target.block_size}, tolerance "
            f"±{target.tolerance:.1%})."
        )
    trace = figures.trace
    if trace is not None and trace.predicted_hit_rate is not None:
        lines.append(
            f"{where}: kvbench's simulation of the same trace on the server's KV blocks predicts "
            f"{trace.predicted_hit_rate:.1%} ({trace.prediction})."
        )
    if reuse.flag:
        lines.append(f"{where}: {reuse.flag}.")
    events = figures.kv_events
    if events is not None:
        stored, removed = events.kv_blocks_stored, events.kv_blocks_removed
        if stored is not None and removed is not None:
            line = f"{where}: KV events: {stored:,} blocks stored, {removed:,} removed"
            churn, thrash = events.kv_eviction_churn_per_s, events.kv_thrash_share
            if removed and churn is not None:
                line += f" ({churn:,.1f}/s)"
            if thrash is not None:
                line += f", {thrash:.0%} of them stored again within {events.kv_thrash_window_s:g} s"
            lines.append(line + f"; at most {events.kv_resident_blocks_peak or 0:,} resident.")
        if events.flag:
            lines.append(f"{where}: KV events: {events.flag}.")
    return lines


def markdown(summary: SweepSummary) -> str:
    meta = summary.meta
    md = [
        f"# kvbench sweep: servers over HTTP\n\nTargets: {recorded(meta.device)}; model {recorded(meta.model_name)}; "
        f"scenario {recorded(meta.scenario)}\n\n"
    ]
    if meta.stop_description:
        md.append(f"Stop: {meta.stop_description}\n\n")
    md.append(f"## {POINT_TABLE.title}\n\n")
    md.append(POINT_TABLE.markdown(ordered(summary.typed_points)))
    searches = summary.endpoint.find_max if summary.endpoint is not None else []
    if searches:
        md.append("\n## The highest load meeting the SLO\n\n")
        md.append(markdown_table(list(FIND_MAX_COLUMNS), find_max_rows(searches)))
    lines = summary.findings or []
    if lines:
        md.append("\n" + "\n\n".join(lines) + "\n")
    return "".join(md)


def write_endpoint_outputs(
    run_dir: Path, meta: dict[str, Any], points: list[dict[str, Any]], searches: Sequence[Search]
) -> dict[str, Any]:
    """summary.json/csv/md (and report.html), then the PNG plots; returns the summary document."""
    typed = ordered([Point.from_json(p) for p in points])
    rows = [p.to_json() for p in typed]  # the points as they were given, in the table's order
    slo = next((figures.slo for p in typed if (figures := EndpointFigures.of(p)).slo), None)
    endpoint = EndpointSummary(list(searches), slo)
    summary = SweepSummary(RunMeta.from_json(meta), rows, findings=findings(typed), endpoint=endpoint)
    document = summary.to_json()
    write_summary(run_dir, document, [flatten(p) for p in rows], markdown(summary))
    write_endpoint_plots(run_dir, summary.meta, typed)
    return document


def _tag(meta: RunMeta) -> str:
    return printable(f"{recorded(meta.model_name)} at {recorded(meta.device)}, scenario {recorded(meta.scenario)}")


def write_endpoint_plots(run_dir: Path, meta: RunMeta, points: Sequence[Point]) -> list[Path]:
    """throughput.png, latency.png, kv_usage.png and a timeline-<target>-<level>.png per point (the HTML
    report draws the same figures into memory)."""
    from kvbench.report import plots  # matplotlib loads only when plots are drawn

    shown = [p for p in points if p.completed]
    if not shown:
        return []
    tag, axis = _tag(meta), level_axis(points)
    written = []
    throughput: dict[str, tuple[list[float], list[float]]] = {}
    spread: dict[str, list[float]] = {}  # --repeat: the 95% CI of each point's output tok/s
    latency: dict[str, dict[str, tuple[list[float], list[float]]]] = {
        "time to first token (TTFT)": {},
        "time per output token (TPOT)": {},
    }
    usage: dict[str, tuple[list[float], list[float]]] = {}
    for engine in sorted({p.engine for p in shown}):
        mine = [p for p in ordered(shown) if p.engine == engine]
        throughput[engine] = ([level_of(p) for p in mine], [p.output_throughput for p in mine])
        if any(p.ci95("output_throughput") for p in mine):
            spread[engine] = [p.ci95("output_throughput") or 0.0 for p in mine]
        for stat in ("p50", "p99"):
            for panel, kind in (("time to first token (TTFT)", "ttft"), ("time per output token (TPOT)", "tpot")):
                timed = [(p, ms) for p in mine if (ms := p.latencies.get(f"{stat}_{kind}_ms")) is not None]
                latency[panel][f"{engine} {stat}"] = ([level_of(p) for p, _ in timed], [ms for _, ms in timed])
        read = [(p, server) for p in mine if (server := EndpointFigures.of(p).server).kv_usage_peak is not None]
        if read:
            usage[f"{engine} peak"] = ([level_of(p) for p, _ in read], [100 * (s.kv_usage_peak or 0) for _, s in read])
            usage[f"{engine} mean"] = ([level_of(p) for p, _ in read], [100 * (s.kv_usage_mean or 0) for _, s in read])
    written.append(
        plots.lines(
            throughput,
            run_dir / "throughput.png",
            f"Output throughput vs load\n{tag}" + ("\nbars: 95% CI over the repeated runs" if spread else ""),
            axis,
            "output tokens / s",
            "higher",
            errors=spread,
            from_zero=True,
        )
    )
    written.append(
        plots.line_panels(
            latency,
            run_dir / "latency.png",
            f"Latency vs load (p50 solid, p99 dashed) — {tag}",
            axis,
            "latency (ms)",
            "lower",
        )
    )
    if usage:
        written.append(
            plots.lines(
                usage,
                run_dir / "kv_usage.png",
                f"Server KV cache usage vs load\n{tag}",
                axis,
                "KV cache usage (% of the server's cache)",
                "near 100% the cache is full: requests wait or are preempted",
            )
        )
    for point in shown:
        name = EndpointFigures.of(point).timeline_file
        data = read_run_json(run_dir, name) if name else None
        if data is not None:
            path = run_file(run_dir, name)
            written.append(
                timeline_plot(
                    EndpointTimeline.from_json(data),
                    run_dir / path.with_suffix(".png").name,
                    f"{point.engine} at {level_text(point)}: client throughput and server KV usage over time\n{tag}",
                )
            )
    return written


def timeline_plot(timeline: EndpointTimeline, path: Path, title: str) -> Path:
    """Client output tok/s (left axis) and the server's KV usage in % (right axis) on one time axis."""
    import matplotlib.pyplot as plt

    from kvbench.report.plots import _save

    fig, ax = plt.subplots(figsize=(7, 4.5))
    bin_s = timeline.bin_s
    xs = [t + bin_s / 2 for t in timeline.client.t_s]
    ax.plot(xs, timeline.client.output_tokens_per_s, "-", color="C0", label="client output tok/s")
    ax.set_xlabel("time since the load started (s)")
    ax.set_ylabel("output tokens / s (client)", color="C0")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    rows = timeline.usage_rows
    handles, labels = ax.get_legend_handles_labels()
    if rows:
        right = ax.twinx()
        right.plot(
            [r.elapsed_s for r in rows],
            [100 * (r.kv_usage or 0.0) for r in rows],
            "-o",
            markersize=3,
            color="C3",
            label="server KV usage %",
        )
        waiting = [(r.elapsed_s, r.waiting) for r in rows if r.waiting is not None]
        if any(count for _, count in waiting):
            right.plot(
                [t for t, _ in waiting],
                [count for _, count in waiting],
                ":",
                color="C2",
                label="server waiting requests",
            )
        blocks = next((r.total_blocks for r in reversed(rows) if r.total_blocks), None)
        events = timeline.kv_events
        if blocks and events is not None and events.t_s:
            right.step(
                events.t_s,
                [100 * count / blocks for count in events.resident_blocks],
                where="post",
                color="C4",
                linestyle="--",
                label="prefix-cache blocks resident % (KV events)",
            )
        right.set_ylabel("KV usage (% of the server's cache) / waiting requests", color="C3")
        right.set_ylim(0, max([105.0, *(count or 0 for _, count in waiting)]))
        more_handles, more_labels = right.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
        removed = events.removed_per_s if events is not None else []
        if events is not None and any(removed):
            ax.plot(
                [t + bin_s / 2 for t in events.bin_t_s],
                removed,
                ":",
                color="C1",
                label="KV blocks evicted / s (KV events)",
            )
            ax.set_ylabel("output tokens / s (client); KV blocks evicted / s", color="C0")
            own_handles, own_labels = ax.get_legend_handles_labels()
            handles, labels = own_handles + more_handles, own_labels + more_labels
    else:
        ax.text(
            0.5,
            0.9,
            "no /metrics scrape: server KV usage unknown",
            transform=ax.transAxes,
            ha="center",
            fontsize=8,
            color="#777777",
        )
    ax.legend(handles, labels, fontsize=8, loc="lower right")
    ax.set_title(f"{title}\n(higher tok/s is better; KV usage near 100% means the cache is full)", fontsize=9)
    return _save(fig, path)


def print_endpoint_sweep(console: Any, document: Mapping[str, Any], run_dir: Path, wide: bool = False) -> None:
    summary = SweepSummary.from_json(document)
    print_whole(console, POINT_TABLE.rich(ordered(summary.typed_points)))
    endpoint = summary.endpoint or EndpointSummary()
    if endpoint.find_max:
        console.print(find_max_table(endpoint.find_max, endpoint.slo))
    for line in summary.findings or []:
        console.print(line, markup=False, highlight=False)
    files = "summary.json, summary.csv, summary.md, results.jsonl, timeline-*.json, watch-*.jsonl, *.png"
    console.print(wrote_line(run_dir, files))


PLAIN_PROGRESS_EVERY_S = 5.0  # off a terminal, a point's progress line at most this often


@dataclass
class _PointProgress:
    """How far a point's load has got."""

    said: float  # when its last plain progress line was printed (perf_counter seconds)
    done: int = 0  # requests ended
    tokens: int = 0  # output tokens of those


class EndpointConsoleProgress:
    """A progress bar per point (requests done, output tok/s so far) and a line per finished point."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.bars = sweep_progress_bars(console)
        self.task: Any = None

    def start(self, engine: str, level: Any, total: int) -> Callable[[Any], None]:
        import time

        if self.task is None:
            self.bars.start()
        else:
            self.bars.remove_task(self.task)
        self.task = self.bars.add_task(f"{engine} {level.label}", total=total, tps="")
        started = time.perf_counter()
        state = _PointProgress(said=started)
        plain = not self.console.is_terminal  # a CI log or a pipe: no bar is drawn, so lines say how far it got

        def on_record(record: Any) -> None:
            state.done += 1
            state.tokens += getattr(record, "output_tokens", None) or len(getattr(record, "token_times", ()))
            now = time.perf_counter()
            elapsed = now - started
            self.bars.update(
                self.task, completed=state.done, tps=f"{state.tokens / elapsed:,.0f} tok/s" if elapsed > 0 else ""
            )
            if plain and (now - state.said >= PLAIN_PROGRESS_EVERY_S or state.done == total):
                state.said = now
                left = elapsed / state.done * (total - state.done)
                self.console.print(
                    f"{engine} {level.label}: {state.done:.0f}/{total} requests, "
                    f"{state.tokens / elapsed if elapsed > 0 else 0:,.0f} output tok/s, "
                    f"{elapsed:,.0f} s so far, about {left:,.0f} s left",
                    markup=False,
                    highlight=False,
                )

        return on_record

    def done(self, point: Point) -> None:
        figures = EndpointFigures.of(point)
        self.console.print(
            f"{point.engine:>16} {level_text(point):<12} {point.status:<5} "
            f"{point.completed} done, {figures.failed} failed, "
            f"{point.output_throughput:,.0f} out tok/s, KV peak "
            f"{share_number(figures.server.kv_usage_peak, 0, missing='-')}%",
            markup=False,
            highlight=False,
        )

    def close(self) -> None:
        if self.task is not None:
            self.bars.stop()
