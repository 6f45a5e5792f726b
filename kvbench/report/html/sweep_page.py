"""The report of a sweep: paged vs contiguous (and a reference engine) at each concurrency."""

from __future__ import annotations

from typing import Any

from kvbench.report.diagnose import diagnose_points
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.html import units
from kvbench.report.html.common import (
    draw,
    figures_block,
    findings_section,
    provenance_section,
    spec_table,
    waterfall_section,
)
from kvbench.report.html.page import Cell, Column, Page, Section, Table, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.report.sweep_report import (
    OUTPUT_LENGTH_COLUMNS,
    POINT_TABLE,
    POINT_TABLE_NOTE,
    REFERENCE_CAPTION,
    REFERENCE_ENGINES,
    article_rows,
    output_length_rows,
    output_length_title,
    shows_output_lengths,
    steady_warnings,
    write_plots,
)

TIE_PCT = 2.0  # a throughput gain within this many percent is called "on par" (simulated, or beyond the CIs)


def build(run: RunFiles) -> Page:
    document = run.document
    if isinstance(document.get("endpoint"), dict):  # servers over HTTP (sweep --target): a page of their own
        from kvbench.report.html import endpoint_page

        return endpoint_page.build(run)
    meta, points = document["meta"], document["points"]
    rows = document.get("article_table") or article_rows(points)
    simulated = bool(meta.get("simulated"))
    badges = ["SIMULATED"] if simulated else []
    if meta.get("interrupted"):
        badges.append("INTERRUPTED")
    title = f"kvbench sweep: paged vs contiguous — {meta.get('model_name', '?')} on {meta.get('device', '?')}"
    subtitle = f"scenario {meta.get('scenario', '?')}"
    if meta.get("scenario_description"):
        subtitle += f": {meta['scenario_description']}"

    figures = draw(lambda: write_plots(run.directory, meta, points))
    waterfalls = {f.name: f for f in figures if f.name.startswith("waterfall-")}
    plots = [f for f in figures if f.name not in waterfalls]

    sections = [
        headline_section(rows, points, meta),
        findings_section(diagnose_points(points, meta, Thresholds(), str(run.directory), kind="sweep")),
    ]
    if plots:
        sections.append(Section("plots", "Plots", [figures_block(plots)]))
    sections.append(points_section(points, meta))
    waterfall = waterfall_section(points, waterfalls)
    if waterfall is not None:
        sections.append(waterfall)
    sections.append(provenance_section(meta, run.files()))
    return Page("sweep", title, subtitle, badges, sections)


# -- the headline ---------------------------------------------------------------------------------------


def _by_key(points: list[dict]) -> dict[tuple[str, int], dict]:
    return {(p["engine"], p["concurrency"]): p for p in points}


def _levels(values: list[int]) -> str:
    return ", ".join(f"C={c}" for c in values)


def _span(values: list[float], fmt) -> str:
    low, high = min(values), max(values)
    return fmt(low) if abs(high - low) < 0.5 else f"{fmt(low)} to {fmt(high)}"


def _reservation_words(meta: dict) -> str:
    reserve, max_len = meta.get("reserve", "max"), meta.get("max_len")
    if reserve == "max":
        return f"max-len ({max_len:,} token slots) for every request" if max_len else "max-len for every request"
    if reserve == "pow2":
        return "the next power of two of each request's length"
    return "exactly each request's length (an oracle no real engine has)"


def _distinguishable(row: dict, meta: dict) -> bool | None:
    """Whether a throughput gain can be told from noise: simulated runs are exact; repeated points have 95%
    confidence intervals; a single measured run cannot say (None)."""
    if meta.get("simulated"):
        return abs(row["gain_pct"]) >= TIE_PCT
    ci_p, ci_c = row.get("paged_tps_ci95"), row.get("contiguous_tps_ci95")
    if ci_p is None or ci_c is None:
        return None
    return abs(row["paged_tps"] - row["contiguous_tps"]) > ci_p + ci_c


def verdict(rows: list[dict], points: list[dict], meta: dict) -> Verdict:
    """Where paging wins and why, in words, from the article-shaped rows and the points."""
    by_key = _by_key(points)
    compared = [r for r in rows if r.get("gain_pct") is not None]
    contiguous_oom = [
        r["concurrency"] for r in rows if r.get("contiguous_status") == "oom" and r.get("paged_status") == "ok"
    ]
    paged_oom = [
        r["concurrency"] for r in rows if r.get("paged_status") == "oom" and r.get("contiguous_status") == "ok"
    ]
    reductions = [r["kv_memory_reduction_pct"] for r in compared if r.get("kv_memory_reduction_pct") is not None]
    sentences: list[str] = []

    if not compared and not contiguous_oom and not paged_oom:
        engines = sorted({p["engine"] for p in points})
        ok = [p for p in points if p["status"] == "ok"]
        headline = (
            f"A sweep of {', '.join(engines) or 'no engine'}: no paged/contiguous pair to compare"
            if points
            else "The sweep recorded no point"
        )
        for p in ok:
            sentences.append(f"{p['engine']} at C={p['concurrency']}: {units.tok_s(p.get('output_throughput'))}.")
        return Verdict(headline, "neutral", sentences)

    if contiguous_oom:
        top = contiguous_oom[0]
        paged = by_key.get(("paged", top), {})
        served = paged.get("completed") or 0
        headline = (
            f"Paging held the load the contiguous baseline could not: at {_levels(contiguous_oom)} "
            f"contiguous ran out of KV memory, paged served {'all ' if not paged.get('rejected') else ''}"
            f"{served:,} request{'s' if served != 1 else ''}"
        )
        tone = "good"
    elif paged_oom:
        headline = (
            f"The paged engine ran out of KV memory at {_levels(paged_oom)} where the contiguous baseline did not"
        )
        tone = "bad"
    elif reductions and max(reductions) > 0:
        headline = (
            f"Paging served the same requests with {_span(reductions, lambda v: f'{v:.0f}%')} less KV memory at peak"
        )
        tone = "good"
    else:
        headline = "Paging and the contiguous baseline held the same KV memory at peak"
        tone = "neutral"
    if paged_oom and tone != "bad":
        tone = "warn"

    if reductions and not headline.startswith("Paging served"):
        sentences.append(
            f"KV memory at peak: paged needed {_span(reductions, lambda v: f'{v:.0f}%')} less than "
            f"contiguous where both completed ({_levels([r['concurrency'] for r in compared])})."
        )
    for c in contiguous_oom:
        cont, paged = by_key.get(("contiguous", c), {}), by_key.get(("paged", c), {})
        sentences.append(
            f"At C={c} the contiguous baseline rejected {units.count(cont.get('rejected'))} of "
            f"{units.count((cont.get('completed') or 0) + (cont.get('rejected') or 0))} requests for lack of KV "
            f"memory (at most {units.count(cont.get('peak_running'))} ran at once); paged completed "
            f"{units.count(paged.get('completed'))} at {units.tok_s(paged.get('output_throughput'))} with at most "
            f"{units.count(paged.get('peak_running'))} running."
        )
    sentences += _throughput_sentences(compared, meta)
    why = _why(rows, by_key, meta, contiguous_oom)
    if why:
        sentences.append(why)
    references = [e for e in REFERENCE_ENGINES if any(r.get(f"{e}_status") for r in rows)]
    for engine in references:
        cells = [f"{_reference_figure(r, engine)} at C={r['concurrency']}" for r in rows if r.get(f"{engine}_status")]
        sentences.append(f"{REFERENCE_ENGINES[engine]} (reference): {', '.join(cells)}. {REFERENCE_CAPTION}.")
    return Verdict(headline, tone, sentences)


def _throughput_sentences(compared: list[dict], meta: dict) -> list[str]:
    if not compared:
        return []
    parts = [f"{r['gain_pct']:+.0f}% at C={r['concurrency']}" for r in compared]
    text = f"Output throughput, paged vs contiguous: {', '.join(parts)}."
    judged = [_distinguishable(r, meta) for r in compared]
    if all(j is None for j in judged):
        text += (
            " One measured run per point: a throughput difference this size may be the machine's noise; "
            "repeat the points for confidence intervals, or compare runs with kvbench compare."
        )
    else:
        same = [r["concurrency"] for r, j in zip(compared, judged, strict=True) if j is False]
        if same:
            basis = "simulated: exact" if meta.get("simulated") else "within the 95% confidence intervals"
            text += f" On par at {_levels(same)} ({basis})."
    return [text]


def _why(rows: list[dict], by_key: dict, meta: dict, contiguous_oom: list[int]) -> str:
    """The memory behind the result, at the concurrency that shows it best (the first OOM, else the highest)."""
    candidates = contiguous_oom or [r["concurrency"] for r in rows if r.get("gain_pct") is not None]
    if not candidates:
        return ""
    c = candidates[0] if contiguous_oom else candidates[-1]
    cont, paged = by_key.get(("contiguous", c)), by_key.get(("paged", c))
    if not cont or not paged or not cont.get("waste") or not paged.get("waste"):
        return ""
    cw, pw = cont["waste"], paged["waste"]
    held_c = (cw.get("reservation_pct") or 0) + (cw.get("internal_pct") or 0)
    held_p = (pw.get("reservation_pct") or 0) + (pw.get("internal_pct") or 0)
    text = (
        f"Why: the contiguous baseline reserves {_reservation_words(meta)} when it admits it; at C={c}, "
        f"reservation and internal fragmentation held {held_c:.1f}% of its KV pool on average (token states "
        f"{cw.get('token_state_pct', 0):.1f}%), against {held_p:.1f}% for paged, which allocates blocks of "
        f"{meta.get('block_size', '?')} tokens as they fill (token states {pw.get('token_state_pct', 0):.1f}%)."
    )
    if (paged.get("peak_running") or 0) > (cont.get("peak_running") or 0):
        text += (
            f" The memory that paging leaves free lets more requests run at once: at most "
            f"{paged['peak_running']} against {cont['peak_running']}."
        )
    return text


def _reference_figure(row: dict, engine: str) -> str:
    """A reference engine's throughput at a point, or its status where it has none."""
    status = row.get(f"{engine}_status")
    return units.tok_s(row.get(f"{engine}_tps")) if status == "ok" else str(status)


def headline_table(rows: list[dict], meta: dict | None = None) -> Table:
    references = [e for e in REFERENCE_ENGINES if any(r.get(f"{e}_status") for r in rows)]
    columns = [
        Column("concurrency (requests in flight)"),
        Column("contiguous output throughput"),
        Column("paged output throughput"),
        Column("paged vs contiguous"),
        Column("KV memory reduction at peak"),
        Column("steady throughput, contiguous"),
        Column("steady throughput, paged"),
        *(Column(f"{REFERENCE_ENGINES[e]} output throughput (reference)") for e in references),
    ]
    body = []
    for r in rows:
        cells = [
            Cell(str(r["concurrency"]), r["concurrency"], field="concurrency"),
            _tps_cell(r, "contiguous"),
            _tps_cell(r, "paged"),
            Cell(
                units.signed_pct(r.get("gain_pct")),
                units.sort_key(r.get("gain_pct")),
                _gain_tone(r, meta or {}),
                field="gain_pct",
            ),
            Cell(
                units.pct(r.get("kv_memory_reduction_pct"), 0),
                units.sort_key(r.get("kv_memory_reduction_pct")),
                field="kv_memory_reduction_pct",
            ),
            _steady_cell(r, "contiguous"),
            _steady_cell(r, "paged"),
        ]
        cells += [_tps_cell(r, e) for e in references]
        body.append(cells)
    repeated = any(r.get(f"{engine}_tps_ci95") for r in rows for engine in ("contiguous", "paged", *references))
    spread = "; ± is the 95% confidence interval over repeats" if repeated else ""
    note = (
        "Output throughput: output tokens per second over the whole point; steady: while all C requests were in "
        f"flight (ramp-up and draining tail left out){spread}. OOM: the engine rejected requests for lack of KV "
        "memory."
    )
    if references:
        note += f" {REFERENCE_CAPTION}."
    return Table("Paged vs contiguous at each concurrency", columns, body, note=note, id="headline-table")


def _gain_tone(row: dict, meta: dict) -> str:
    """Green or red only where the verdict calls the gain a difference: a single measured run's -5% is noise."""
    gain = row.get("gain_pct")
    if gain is None or row.get("paged_tps") is None or row.get("contiguous_tps") is None:
        return ""
    if not _distinguishable(row, meta):
        return ""
    return "good" if gain > 0 else "bad"


def _tps_cell(row: dict, engine: str) -> Cell:
    status = row.get(f"{engine}_status")
    field = f"{engine}_tps"
    if status is None:
        return Cell(units.MISSING, None, "muted", field)
    if status != "ok":
        return Cell(status.upper(), -1, "bad", field)
    text = units.tok_s(row.get(field))
    ci = row.get(f"{engine}_tps_ci95")
    if ci:
        text = f"{units.num(row.get(field))} ± {units.num(ci)} tok/s"
    return Cell(text, units.sort_key(row.get(field)), "", field)


def _steady_cell(row: dict, engine: str) -> Cell:
    status = row.get(f"{engine}_status")
    field = f"{engine}_steady_tps"
    if status is None or status == "error":
        return Cell(units.MISSING, None, "muted", field)
    if status == "oom":
        return Cell("OOM", -1, "bad", field)
    value = row.get(field)
    return Cell(
        "no full-load window" if value is None else units.tok_s(value),
        units.sort_key(value),
        "muted" if value is None else "",
        field,
    )


def headline_section(rows: list[dict], points: list[dict], meta: dict) -> Section:
    blocks: list[Any] = [verdict(rows, points, meta), headline_table(rows, meta)]
    if meta.get("stop_description") or meta.get("budget_source"):
        blocks.append(
            Text(
                [
                    f"KV budget: {meta['budget_source']}." if meta.get("budget_source") else "",
                    f"Stop: {meta['stop_description']}." if meta.get("stop_description") else "",
                ],
                tone="note",
            )
        )
    return Section("headline", "Verdict", blocks)


# -- per point ------------------------------------------------------------------------------------------


def points_section(points: list[dict], meta: dict) -> Section:
    blocks: list[Any] = []
    warnings = steady_warnings(points)
    if warnings:
        blocks.append(Text([w[0].upper() + w[1:] + "." for w in warnings], tone="warn"))
    blocks.append(spec_table(POINT_TABLE, points, "points-table", POINT_TABLE_NOTE))
    if shows_output_lengths(meta):
        rows = [[Cell(text, None) for text in row] for row in output_length_rows(points)]
        blocks.append(
            Table(
                output_length_title(meta),
                [Column(c, c != "engine") for c in OUTPUT_LENGTH_COLUMNS],
                rows,
                id="output-lengths-table",
                note="Output lengths in tokens; internal: % of the KV pool, time-averaged.",
            )
        )
    return Section("points", "Per point", blocks)
