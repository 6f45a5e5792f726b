"""The report of a waste run: where each strategy's KV pool goes, next to the article's analytic estimate."""

from __future__ import annotations

from typing import Any

from kvbench.report.diagnose import diagnose_points
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.html import units
from kvbench.report.html.common import draw, figures_block, findings_section, provenance_section, spec_table
from kvbench.report.html.page import Page, Section, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.report.sweep_report import (
    POINT_TABLE,
    POINT_TABLE_NOTE,
    output_length_spec,
    shows_output_lengths,
    with_output_lengths,
)
from kvbench.report.waste_report import SHARE_NOTE, SHARE_TABLE, stop_text, waste_plot
from kvbench.results.point import Point
from kvbench.workload.dataset import sample_note


def build(run: RunFiles) -> Page:
    document = run.document
    meta, points = document["meta"], document["points"]
    model = meta.get("model") or {}
    title = (
        f"kvbench waste: where KV memory goes — {model.get('name', '?')} {model.get('dtype', '')} on "
        f"{meta.get('gpu', '?')}, max-len {meta.get('max_len', '?')}"
    )
    subtitle = (
        f"{meta.get('workload', '')}; {units.count(meta.get('requests'))} requests, "
        f"{units.count(meta.get('concurrency'))} in flight; KV pool {units.nbytes(meta.get('kv_budget_bytes'))} "
        f"({units.count(meta.get('pool_slots'))} token slots)"
    )
    figures = draw(lambda: waste_plot(document, run.directory / "waste.png"))
    sections = [
        headline_section(document),
        findings_section(diagnose_points(points, meta, Thresholds(), str(run.directory), kind="waste"), "strategies"),
    ]
    if figures:
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    per_point: list[Any] = [
        spec_table(
            POINT_TABLE,
            [Point.from_json(p) for p in points],
            "points-table",
            "Simulated step times (roofline). " + POINT_TABLE_NOTE,
        )
    ]
    if shows_output_lengths(meta):
        lengths = with_output_lengths([Point.from_json(p) for p in points])
        spec = output_length_spec(meta, f"Stop {stop_text(meta)}.")
        per_point.append(spec_table(spec, lengths, "output-lengths-table", spec.caption))
    sections.append(Section("points", "Per strategy", per_point))
    sections.append(provenance_section(meta, run.files()))
    return Page("waste", title, subtitle, ["SIMULATED"], sections)


def verdict(document: dict) -> Verdict:
    meta, points, analytic = document["meta"], document["points"], document.get("analytic") or {}
    ok = [p for p in points if p.get("status") == "ok" and p.get("effective_usage_pct") is not None]
    paged = [p for p in ok if p["engine"].startswith("paged")]
    contiguous = [p for p in ok if p["engine"].startswith("contiguous") and not p.get("hindsight_bound")]
    sentences = []
    estimate = analytic.get("at_mean_len_pct")
    if estimate is not None:
        sentences.append(
            f"The article's estimate for a max-len reservation: (max-len − mean length) / max-len = "
            f"({meta.get('max_len')} − {analytic.get('mean_len')}) / {meta.get('max_len')} = "
            f"{estimate:.1f}% of its slots wasted ({analytic.get('at_sampled_mean_pct', 0):.1f}% at this "
            f"run's sampled mean of {analytic.get('sampled_mean_len', 0):,.0f} tokens)."
        )
    best = max(paged, key=lambda p: p["effective_usage_pct"], default=None)
    worst = next((p for p in contiguous if p["engine"] == "contiguous-max"), None) or min(
        contiguous, key=lambda p: p["effective_usage_pct"], default=None
    )
    if best is not None and worst is not None:
        headline = (
            f"Effective KV memory usage: {best['engine']} {best['effective_usage_pct']:.1f}%, "
            f"{worst['engine']} {worst['effective_usage_pct']:.1f}%"
        )
        held = worst["waste"]["reservation_pct"] + worst["waste"]["internal_pct"]
        sentences.append(
            f"Measured: {worst['engine']} held token states in {worst['waste']['token_state_pct']:.1f}% of the pool "
            f"on average while reservation and internal fragmentation took {held:.1f}%, so "
            f"{100 - worst['effective_usage_pct']:.1f}% of what it allocated was waste; {best['engine']} wasted "
            f"{100 - best['effective_usage_pct']:.1f}% (internal fragmentation {best['waste']['internal_pct']:.2f}%)."
        )
        if best.get("peak_running") and worst.get("peak_running"):
            sentences.append(
                f"The same pool held {best['peak_running']:,} requests at once with {best['engine']} "
                f"against {worst['peak_running']:,} with {worst['engine']}."
            )
        tone = "good" if best["effective_usage_pct"] > worst["effective_usage_pct"] else "warn"
    else:
        named = ok[0] if ok else None
        headline = (
            f"Effective KV memory usage: {named['engine']} {named['effective_usage_pct']:.1f}%"
            if named
            else "No strategy completed"
        )
        tone = "neutral" if named else "bad"
    sentences.append(
        "Effective usage is the PagedAttention paper's measure: token states / (token states + "
        "reservation + internal + external fragmentation)."
    )
    return Verdict(headline, tone, sentences)


def headline_section(document: dict) -> Section:
    meta = document["meta"]
    notes = [f"Stop: {stop_text(meta)}."]
    if meta.get("dataset"):
        notes.append(f"Dataset: {sample_note(meta['dataset'])}.")
    return Section(
        "headline",
        "Verdict",
        [
            verdict(document),
            spec_table(SHARE_TABLE, document["points"], "headline-table", SHARE_NOTE),
            Text(notes, tone="note"),
        ],
    )
