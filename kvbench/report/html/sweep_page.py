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
    article_spec,
    distinguishable,
    output_length_rows,
    output_length_title,
    points_by_key,
    references,
    shows_output_lengths,
    steady_warnings,
    write_plots,
)
from kvbench.results.article import REFERENCE_ENGINES, ArticleRow, article_rows


def build(run: RunFiles) -> Page:
    document = run.document
    if isinstance(document.get("endpoint"), dict):  # servers over HTTP (sweep --target): a page of their own
        from kvbench.report.html import endpoint_page

        return endpoint_page.build(run)
    meta, points = document["meta"], document["points"]
    saved = document.get("article_table")
    rows = [ArticleRow.from_json(row) for row in saved] if saved else article_rows(points)
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


def verdict(rows: list[ArticleRow], points: list[dict], meta: dict) -> Verdict:
    """Where paging wins and why, in words, from the article-shaped rows and the points."""
    by_key = points_by_key(points)
    compared = [r for r in rows if r.gain_pct is not None]
    contiguous_oom = [r.concurrency for r in rows if r.status("contiguous") == "oom" and r.status("paged") == "ok"]
    paged_oom = [r.concurrency for r in rows if r.status("paged") == "oom" and r.status("contiguous") == "ok"]
    reductions = [r.kv_memory_reduction_pct for r in compared if r.kv_memory_reduction_pct is not None]
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
            f"contiguous where both completed ({_levels([r.concurrency for r in compared])})."
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
    for engine in references(rows):
        cells = [f"{_reference_figure(r, engine)} at C={r.concurrency}" for r in rows if r.status(engine)]
        sentences.append(f"{REFERENCE_ENGINES[engine]} (reference): {', '.join(cells)}. {REFERENCE_CAPTION}.")
    return Verdict(headline, tone, sentences)


def _throughput_sentences(compared: list[ArticleRow], meta: dict) -> list[str]:
    if not compared:
        return []
    parts = [f"{r.gain_pct:+.0f}% at C={r.concurrency}" for r in compared]
    text = f"Output throughput, paged vs contiguous: {', '.join(parts)}."
    judged = [distinguishable(r, bool(meta.get("simulated"))) for r in compared]
    if all(j is None for j in judged):
        text += (
            " One measured run per point: a throughput difference this size may be the machine's noise; "
            "repeat the points for confidence intervals, or compare runs with kvbench compare."
        )
    else:
        same = [r.concurrency for r, j in zip(compared, judged, strict=True) if j is False]
        if same:
            basis = "simulated: exact" if meta.get("simulated") else "within the 95% confidence intervals"
            text += f" On par at {_levels(same)} ({basis})."
    return [text]


def _why(rows: list[ArticleRow], by_key: dict, meta: dict, contiguous_oom: list[int]) -> str:
    """The memory behind the result, at the concurrency that shows it best (the first OOM, else the highest)."""
    candidates = contiguous_oom or [r.concurrency for r in rows if r.gain_pct is not None]
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


def _reference_figure(row: ArticleRow, engine: str) -> str:
    """A reference engine's throughput at a point, or its status where it has none."""
    figures = row.figures(engine)
    return units.tok_s(figures.tps) if figures and figures.ok else str(row.status(engine))


def headline_table(rows: list[ArticleRow], meta: dict | None = None) -> Table:
    """The article's table (:func:`~kvbench.report.sweep_report.article_spec`) as the page draws it."""
    spec = article_spec(rows, bool((meta or {}).get("simulated")))
    return spec_table(spec, rows, "headline-table", f"{spec.caption}.")


def headline_section(rows: list[ArticleRow], points: list[dict], meta: dict) -> Section:
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
