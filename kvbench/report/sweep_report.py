"""The sweep's tables (article-shaped and detailed), summary files and plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.table import Table

from kvbench.report.run_meta import summary_document
from kvbench.report.rundir import flatten, markdown_table, write_summary
from kvbench.report.waterfall import waterfall_levels, waterfall_plot, waterfall_plot_name
from kvbench.values import human_bytes


def _by_key(points: list[dict]) -> dict[tuple[str, int], dict]:
    return {(p["engine"], p["concurrency"]): p for p in points}


REFERENCE_ENGINES = {"vllm": "vLLM"}  # external engines shown as a reference column (their own kernels and scheduler)
REFERENCE_CAPTION = ("vLLM: its own kernels, scheduler and memory manager on the same requests, closed loop, "
                     "warm-up and KV budget: a reference, not a controlled A/B")


def article_rows(points: list[dict]) -> list[dict[str, Any]]:
    """Per concurrency: contiguous TPS (or OOM), paged TPS with gain %, KV memory reduction, TPS ratio; and the
    TPS of a reference engine (vLLM) when the sweep ran one."""
    by_key = _by_key(points)
    rows = []
    for concurrency in sorted({p["concurrency"] for p in points}):
        paged = by_key.get(("paged", concurrency))
        contiguous = by_key.get(("contiguous", concurrency))
        row: dict[str, Any] = {"concurrency": concurrency, "contiguous_tps": None, "contiguous_status": None,
                               "paged_tps": None, "paged_status": None, "gain_pct": None,
                               "kv_memory_reduction_pct": None, "paged_over_contiguous_tps": None}
        if contiguous:
            row["contiguous_status"] = contiguous["status"]
            row["contiguous_tps"] = contiguous.get("output_throughput")
            row["contiguous_tps_ci95"] = contiguous.get("output_throughput_ci95")
            row["contiguous_steady_tps"] = contiguous.get("steady_output_throughput")
        if paged:
            row["paged_status"] = paged["status"]
            row["paged_tps"] = paged.get("output_throughput")
            row["paged_tps_ci95"] = paged.get("output_throughput_ci95")
            row["paged_steady_tps"] = paged.get("steady_output_throughput")
        if (paged and contiguous and paged["status"] == "ok" and contiguous["status"] == "ok"
                and _positive(contiguous.get("output_throughput")) and _positive(contiguous.get("kv_peak_allocated_bytes"))):
            ratio = paged["output_throughput"] / contiguous["output_throughput"]
            row["paged_over_contiguous_tps"] = ratio
            row["gain_pct"] = 100 * (ratio - 1)
            row["kv_memory_reduction_pct"] = 100 * (1 - paged["kv_peak_allocated_bytes"] / contiguous["kv_peak_allocated_bytes"])
        for engine in REFERENCE_ENGINES:
            reference = by_key.get((engine, concurrency))
            if reference:
                row[f"{engine}_status"] = reference["status"]
                row[f"{engine}_tps"] = reference.get("output_throughput")
                row[f"{engine}_tps_ci95"] = reference.get("output_throughput_ci95")
        rows.append(row)
    return rows


def _references(rows: list[dict]) -> list[str]:
    return [engine for engine in REFERENCE_ENGINES if any(row.get(f"{engine}_status") for row in rows)]


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _tps_cell(tps: float | None, status: str | None, ci95: float | None = None) -> str:
    if status is None:
        return "-"
    if status == "oom":
        return "OOM"
    if status == "error":
        return "error"
    return f"{tps:,.1f}" + (f" ± {ci95:,.1f}" if ci95 else "")


def _steady_cell(tps: float | None, status: str | None) -> str:
    if status is None or status == "error":
        return "-"
    if status == "oom":
        return "OOM"
    return "no window" if tps is None else f"{tps:,.1f}"


def article_table(rows: list[dict], simulated: bool) -> Table:
    references = _references(rows)
    steady_note = ("TPS: output tokens/s over the whole run; steady: while all C requests were in flight "
                   "(ramp-up and draining tail left out)")
    table = Table(title="Paged vs contiguous (measured; ± is the 95% CI over repeats)" + (" — SIMULATED" if simulated else ""),
                  caption=steady_note + (f". {REFERENCE_CAPTION}" if references else ""))
    for column in ("concurrency", "contiguous TPS", "paged TPS", "KV memory reduction", "steady TPS contiguous",
                   "steady TPS paged", *(f"{REFERENCE_ENGINES[e]} TPS (reference)" for e in references)):
        table.add_column(column, justify="right")
    for row in rows:
        paged = _tps_cell(row["paged_tps"], row["paged_status"], row.get("paged_tps_ci95"))
        if row["gain_pct"] is not None:
            paged += f" ({row['gain_pct']:+.0f}%)"
        reduction = "-" if row["kv_memory_reduction_pct"] is None else f"{row['kv_memory_reduction_pct']:.0f}%"
        contiguous = _tps_cell(row["contiguous_tps"], row["contiguous_status"], row.get("contiguous_tps_ci95"))
        table.add_row(str(row["concurrency"]), contiguous, paged, reduction,
                      _steady_cell(row.get("contiguous_steady_tps"), row["contiguous_status"]),
                      _steady_cell(row.get("paged_steady_tps"), row["paged_status"]),
                      *(_tps_cell(row.get(f"{e}_tps"), row.get(f"{e}_status"), row.get(f"{e}_tps_ci95")) for e in references))
    return table


def detail_table(points: list[dict]) -> Table:
    table = Table(title="Per point (TPS = output tokens/s; latencies in ms; waste = % of pool, time-averaged)")
    for column in ("engine", "C", "status", "done/rej", "out TPS", "steady TPS (window)", "p50/p99 TTFT",
                   "p50/p99 TPOT", "peak run", "preempt", "used/res/int/ext %", "frag"):
        table.add_column(column, justify="left" if column in ("engine", "status") else "right")
    for p in points:
        if p["status"] == "error":
            table.add_row(p["engine"], str(p["concurrency"]), "error", "", "", "", "", "", "", "",
                          p.get("error", "")[:40], "")
            continue
        w = p["waste"]
        table.add_row(
            p["engine"], str(p["concurrency"]), p["status"], f"{p['completed']}/{p['rejected']}",
            f"{p['output_throughput']:,.1f}", _window_cell(p), _pair(p, "ttft"), _pair(p, "tpot"),
            str(p["peak_running"]), str(p["preemptions"]),
            f"{w['token_state_pct']:.0f}/{w['reservation_pct']:.0f}/{w['internal_pct']:.0f}/{w['external_pct']:.0f}",
            f"{p['fragmentation_mean']:.2f}",
        )
    return table


def _window_cell(point: dict) -> str:
    tps = point.get("steady_output_throughput")
    if tps is None:
        return "no window"
    return f"{tps:,.1f} ({point['steady_window_s']:,.2f} s, {point['steady_window_pct']:.0f}%)"


def steady_warnings(points: list[dict]) -> list[str]:
    """Points whose full-load window is missing or short: their whole-run TPS is mostly ramp-up and tail."""
    lines = []
    points = [p for p in points if p["status"] == "ok"]  # an OOM point's answer is OOM, not a throughput
    missing = [p for p in points if p.get("steady_output_throughput") is None]
    if missing:
        names = ", ".join(f"{p['engine']} C={p['concurrency']} ({p['completed'] + p['rejected']} requests)"
                          for p in missing)
        lines.append(f"no steady window at {names}: the closed loop never held all its requests in flight (fewer "
                     "requests than the concurrency); send more requests per point")
    short = [p for p in points if (p.get("steady_window_pct") or 100) < 25]
    if short:
        names = ", ".join(f"{p['engine']} C={p['concurrency']} ({p['steady_window_pct']:.0f}%)" for p in short)
        lines.append(f"short steady window at {names}: the whole-run TPS there is mostly ramp-up and draining tail; "
                     "compare the steady TPS, or send more requests per point")
    return lines


OUTPUT_LENGTH_COLUMNS = ("engine", "C", "output len mean/p50/p90/max", "ended at EOS", "internal %", "KV peak",
                         "hindsight oracle KV peak")


def output_length_title(meta: dict) -> str:
    if meta.get("stop", "length") == "eos":
        how = ("ending at EOS at each reference length (simulated)" if meta.get("simulated")
               else "decided by the model (EOS)")
    else:
        how = "drawn or reference, EOS ignored"
    return f"Output lengths {how}, and the KV memory they left unused"


def output_length_rows(points: list[dict]) -> list[list[str]]:
    """One row per measured point, in :data:`OUTPUT_LENGTH_COLUMNS` (the console table and Markdown alike)."""
    rows = []
    for p in points:
        if p.get("status") == "error" or p.get("output_len_mean") is None:
            continue
        lengths = (f"{p['output_len_mean']:,.0f} / {p['output_len_p50']:,.0f} / {p['output_len_p90']:,.0f} / "
                   f"{p['output_len_max']:,}")
        oracle = p.get("kv_hindsight_oracle_peak_bytes")
        rows.append([p["engine"], str(p["concurrency"]), lengths, f"{p.get('stopped_at_eos', 0)}/{p['completed']}",
                     f"{p['waste']['internal_pct']:.1f}", human_bytes(p["kv_peak_allocated_bytes"]),
                     "-" if oracle is None else f"{human_bytes(oracle)} (not runnable)"])
    return rows


def output_length_table(points: list[dict], meta: dict, caption: str | None = None) -> Table:
    """The output lengths that occurred (EOS-decided in an eos run) next to the memory they left unused;
    ``caption`` replaces the sweep's note on how the contiguous baseline reserves."""
    table = Table(title=output_length_title(meta), caption=caption or _reservation_caption(meta))
    for column in OUTPUT_LENGTH_COLUMNS:
        table.add_column(column, justify="left" if column == "engine" else "right")
    for row in output_length_rows(points):
        table.add_row(*row)
    return table


def _reservation_caption(meta: dict) -> str:
    max_len, reserve = meta.get("max_len"), meta.get("reserve", "max")
    if meta.get("stop") == "eos":
        plan = f"max-len {max_len}" if reserve == "max" else f"the next power of two of max-len {max_len}"
        return (f"The contiguous baseline cannot know where an answer ends: it reserves {plan} per request "
                "(prompt + max_tokens). Hindsight oracle: slabs of exactly each real length, in the same schedule, "
                "a bound no engine reaches.")
    return f"The contiguous baseline reserves by policy {reserve} (max-len {max_len})."


def _pair(point: dict, kind: str) -> str:
    a, b = point.get(f"p50_{kind}_ms"), point.get(f"p99_{kind}_ms")
    return "-" if a is None or b is None else f"{a:,.0f}/{b:,.0f}"


def shows_output_lengths(meta: dict) -> bool:
    """Runs whose lengths came from the model or from real data show what occurred (table and plot)."""
    return meta.get("stop") == "eos" or bool(meta.get("dataset"))


def print_sweep(console, points: list[dict], simulated: bool, waterfall: bool, run_dir: Path,
                meta: dict | None = None) -> None:
    """The article-shaped table, the detailed table, the output lengths of a real workload, warnings about
    missing or short steady windows and, when asked, every point's memory waterfall."""
    console.print(article_table(article_rows(points), simulated))
    console.print(detail_table(points))
    if meta is not None and shows_output_lengths(meta):
        console.print(output_length_table(points, meta))
    for line in steady_warnings(points):
        console.print(f"[yellow]warning: {line}[/yellow]")
    if waterfall:
        from kvbench.report.waterfall import waterfall_table

        for point in points:
            if point.get("waterfall"):
                console.print(waterfall_table(point))
    console.print(f"wrote {run_dir}/ (report.html, summary.json, summary.csv, summary.md, results.jsonl, *.png)")


def scenarios_table(scenarios: dict) -> Table:
    table = Table(title="Built-in scenarios (by name, or a TOML file of your own)")
    table.add_column("name")
    table.add_column("description")
    for name, scenario in scenarios.items():
        table.add_row(name, scenario.description)
    return table


def write_outputs(run_dir: Path, meta: dict, points: list[dict]) -> dict:
    for point in points:  # the memory waterfall of every measured point (additive field)
        if point.get("status") != "error":
            point["waterfall"] = waterfall_levels(point, "simulated" if meta.get("simulated") else None)
    rows = article_rows(points)
    document = summary_document("sweep", meta, points, article_table=rows)
    simulated = " (simulated)" if meta.get("simulated") else ""
    md = [f"# kvbench sweep{simulated}\n\n{meta.get('scenario_description', '')}\n\nKV budget: {meta.get('budget_source', '')}\n\n"]
    references = _references(rows)
    if meta.get("stop_description"):
        md.append(f"Stop: {meta['stop_description']}\n\n")
    md.append(markdown_table(
        ["concurrency", "contiguous TPS", "paged TPS", "gain %", "KV memory reduction %", "paged/contiguous",
         "steady TPS contiguous", "steady TPS paged", *(f"{REFERENCE_ENGINES[e]} TPS (reference)" for e in references)],
        [[r["concurrency"], _tps_cell(r["contiguous_tps"], r["contiguous_status"]),
          _tps_cell(r["paged_tps"], r["paged_status"]), r["gain_pct"], r["kv_memory_reduction_pct"],
          r["paged_over_contiguous_tps"], _steady_cell(r.get("contiguous_steady_tps"), r["contiguous_status"]),
          _steady_cell(r.get("paged_steady_tps"), r["paged_status"]),
          *(_tps_cell(r.get(f"{e}_tps"), r.get(f"{e}_status")) for e in references)] for r in rows]))
    md.append("\nSteady TPS: output tokens/s while all C requests were in flight (ramp-up and draining tail left "
              "out).\n")
    if references:
        md.append(f"\n{REFERENCE_CAPTION}.\n")
    write_summary(run_dir, document, [flatten(p) for p in points], "".join(md))
    write_plots(run_dir, meta, points)
    return document


def _plot_label(engine: str) -> str:
    return f"{engine} (reference)" if engine in REFERENCE_ENGINES else engine


def write_plots(run_dir: Path, meta: dict, points: list[dict]) -> None:
    """The sweep's PNG plots, from its points and the timeline files in ``run_dir`` (the HTML report draws the
    same figures into memory)."""
    from kvbench.report import plots  # matplotlib loads only when plots are drawn

    ok = [p for p in points if p["status"] != "error"]
    if not ok:
        return
    tag = f"{meta.get('model_name', '')} on {meta.get('device', '')}, scenario {meta.get('scenario', '')}"
    tag += " — SIMULATED" if meta.get("simulated") else ""
    engines = sorted({p["engine"] for p in ok})
    series = {}
    for engine in engines:
        mine = sorted((p for p in ok if p["engine"] == engine and p["status"] == "ok"), key=lambda p: p["concurrency"])
        series[_plot_label(engine)] = ([p["concurrency"] for p in mine], [p["output_throughput"] for p in mine])
    plots.lines(series, run_dir / "throughput.png", f"Output throughput vs concurrency\n{tag}",
                "concurrency (requests in flight)", "output tokens / s", "higher")
    panels: dict[str, dict] = {"time to first token (TTFT)": {}, "time per output token (TPOT)": {}}
    for engine in engines:
        mine = sorted((p for p in ok if p["engine"] == engine and p.get("p50_tpot_ms") is not None),
                      key=lambda p: p["concurrency"])
        xs = [p["concurrency"] for p in mine]
        for stat in ("p50", "p99"):
            label = f"{_plot_label(engine)} {stat}"
            panels["time to first token (TTFT)"][label] = (xs, [p[f"{stat}_ttft_ms"] for p in mine])
            panels["time per output token (TPOT)"][label] = (xs, [p[f"{stat}_tpot_ms"] for p in mine])
    plots.line_panels(panels, run_dir / "latency.png", f"Latency vs concurrency (p50 solid, p99 dashed) — {tag}",
                      "concurrency (requests in flight)", "latency (ms)", "lower")
    ordered = sorted(ok, key=lambda p: (p["concurrency"], p["engine"]))
    plots.waste_breakdown([f"{p['engine']}\nC={p['concurrency']}" for p in ordered], [p["waste"] for p in ordered],
                          run_dir / "memory.png", "KV memory breakdown per point", tag)
    for point in ordered:
        waterfall_plot(point, run_dir / waterfall_plot_name(point), tag)
    top = max(p["concurrency"] for p in ok)
    if shows_output_lengths(meta):
        at_top = {p["engine"]: p for p in ok if p["concurrency"] == top}
        if at_top:
            plots.output_lengths_and_waste(at_top, run_dir / "output_lengths.png",
                                           f"Output lengths that occurred and the KV memory they left unused, "
                                           f"C={top}\n{tag}", meta.get("stop", "length"), meta.get("max_len"),
                                           bool(meta.get("simulated")))
    timelines, total_blocks = {}, None
    for engine in engines:
        path = run_dir / f"timeline-{engine}-c{top}.json"
        reference = next((p.get("reference") or {} for p in ok if p["engine"] == engine), {})
        if reference.get("block_size", meta.get("block_size")) != meta.get("block_size"):
            continue  # blocks of another size are not comparable on one axis
        if path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
            if engine not in REFERENCE_ENGINES or total_blocks is None:  # the pool of kvbench's own engines
                total_blocks = data["total_blocks"]
            timelines[_plot_label(engine)] = ([t for t, _ in data["time_s_blocks"]], [b for _, b in data["time_s_blocks"]])
    if timelines:
        plots.lines(timelines, run_dir / "blocks_over_time.png",
                    f"KV blocks in use over time at concurrency {top} (pool: {total_blocks} blocks)\n{tag}",
                    "time since start of the point (s)", "blocks in use", "neither: higher use of a full pool is "
                    "better, a lower line for the same work is", markers=False, hline=total_blocks)
