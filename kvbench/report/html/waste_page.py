"""The report of a waste run: where each strategy's KV pool goes, next to the article's analytic estimate."""

from __future__ import annotations

from typing import Any

from kvbench import units
from kvbench.report.diagnose import diagnose_points
from kvbench.report.diagnose.thresholds import Thresholds
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
from kvbench.results.strategy_point import StrategyPoint
from kvbench.results.waste_study import WasteStudy
from kvbench.workload.dataset import sample_note


def build(run: RunFiles) -> Page:
    study = WasteStudy.from_json(run.document)
    meta, points = study.meta, study.points
    written = meta.to_json()
    title = (
        f"kvbench waste: where KV memory goes — {_or(meta.model_name, '?')} {_or(meta.model_dtype, '')} on "
        f"{_or(meta.gpu, '?')}, max-len {_or(meta.max_len, '?')}"
    )
    subtitle = (
        f"{_or(meta.workload, '')}; {units.count(meta.requests)} requests, "
        f"{units.count(meta.concurrency)} in flight; "
        f"KV pool {units.human_bytes(meta.kv_budget_bytes, missing=units.MISSING)} "
        f"({units.count(meta.pool_slots)} token slots)"
    )
    figures = draw(lambda: waste_plot(study, run.directory / "waste.png"))
    sections = [
        headline_section(study),
        findings_section(
            diagnose_points([p.to_json() for p in points], meta, Thresholds(), str(run.directory), kind="waste"),
            "strategies",
        ),
    ]
    if figures:
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    per_point: list[Any] = [
        spec_table(POINT_TABLE, points, "points-table", "Simulated step times (roofline). " + POINT_TABLE_NOTE)
    ]
    if shows_output_lengths(meta):
        lengths = with_output_lengths(points)
        spec = output_length_spec(meta, f"Stop {stop_text(meta.stop)}.")
        per_point.append(spec_table(spec, lengths, "output-lengths-table", spec.caption))
    sections.append(Section("points", "Per strategy", per_point))
    sections.append(provenance_section(written, run.files()))
    return Page("waste", title, subtitle, ["SIMULATED"], sections)


def _or(value: Any, missing: str) -> Any:
    """A recorded value as the title shows it; ``missing`` where the run did not record it."""
    return missing if value is None else value


def verdict(study: WasteStudy) -> Verdict:
    meta, analytic = study.meta, study.analytic
    ok = [p for p in study.points if p.status == "ok" and p.effective_usage_pct is not None]
    paged = [p for p in ok if p.engine.startswith("paged")]
    contiguous = [p for p in ok if p.engine.startswith("contiguous") and not p.hindsight_bound]
    sentences = []
    if analytic is not None and analytic.at_mean_len_pct is not None:
        sentences.append(
            f"The article's estimate for a max-len reservation: (max-len − mean length) / max-len = "
            f"({meta.max_len} − {analytic.mean_len}) / {meta.max_len} = "
            f"{analytic.at_mean_len_pct:.1f}% of its slots wasted ({analytic.at_sampled_mean_pct:.1f}% at this "
            f"run's sampled mean of {analytic.sampled_mean_len:,.0f} tokens)."
        )
    best = max(paged, key=_effective, default=None)
    worst = next((p for p in contiguous if p.engine == "contiguous-max"), None) or min(
        contiguous, key=_effective, default=None
    )
    if best is not None and worst is not None:
        best_usage, worst_usage = _effective(best), _effective(worst)
        headline = f"Effective KV memory usage: {best.engine} {best_usage:.1f}%, {worst.engine} {worst_usage:.1f}%"
        shares = worst.shares
        held = (shares.reservation_pct or 0.0) + (shares.internal_pct or 0.0)
        sentences.append(
            f"Measured: {worst.engine} held token states in {shares.token_state_pct:.1f}% of the pool "
            f"on average while reservation and internal fragmentation took {held:.1f}%, so "
            f"{100 - worst_usage:.1f}% of what it allocated was waste; {best.engine} wasted "
            f"{100 - best_usage:.1f}% (internal fragmentation {best.shares.internal_pct:.2f}%)."
        )
        if best.peak_running and worst.peak_running:
            sentences.append(
                f"The same pool held {best.peak_running:,} requests at once with {best.engine} "
                f"against {worst.peak_running:,} with {worst.engine}."
            )
        tone = "good" if best_usage > worst_usage else "warn"
    else:
        named = ok[0] if ok else None
        headline = (
            f"Effective KV memory usage: {named.engine} {named.effective_usage_pct:.1f}%"
            if named
            else "No strategy completed"
        )
        tone = "neutral" if named else "bad"
    sentences.append(
        "Effective usage is the PagedAttention paper's measure: token states / (token states + "
        "reservation + internal + external fragmentation)."
    )
    return Verdict(headline, tone, sentences)


def _effective(point: StrategyPoint) -> float:
    """A point's effective usage (%), of the points that measured one."""
    assert point.effective_usage_pct is not None
    return point.effective_usage_pct


def headline_section(study: WasteStudy) -> Section:
    meta = study.meta
    notes = [f"Stop: {stop_text(meta.stop)}."]
    if meta.dataset:
        notes.append(f"Dataset: {sample_note(meta.dataset.to_json())}.")
    return Section(
        "headline",
        "Verdict",
        [
            verdict(study),
            spec_table(SHARE_TABLE, study.points, "headline-table", SHARE_NOTE),
            Text(notes, tone="note"),
        ],
    )
