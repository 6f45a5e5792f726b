"""The report of a watch: a serving engine's KV cache over time, from the timeline ``kvbench watch`` recorded."""

from __future__ import annotations

from typing import Any

from kvbench import units
from kvbench.report.diagnose.live_rules import seconds
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.diagnose.watch_timeline import Timeline, diagnose_timeline, read_timeline
from kvbench.report.html.common import draw, figures_block, findings_section, provenance_section
from kvbench.report.html.page import Cell, Column, Fact, Page, Section, Table, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.report.watch_report import watch_plot
from kvbench.results.watch_records import read_header
from kvbench.results.watch_summary import InstanceSummary

MAX_ROWS = 400  # scrapes listed per instance (the last ones); the plot and the summary use them all


def build(run: RunFiles) -> Page:
    assert run.timeline is not None  # a watch run is its timeline
    timeline = read_timeline(run.timeline)
    header = read_header(run.timeline)  # None: read_timeline has said why already, or it has no header
    sources = list(timeline.windows)
    title = f"kvbench watch: {timeline.url or run.timeline.name}"
    subtitle = f"{len(sources)} engine instance{'s' if len(sources) != 1 else ''}: {'; '.join(sources)}"
    diagnosis = diagnose_timeline(run.timeline, Thresholds())
    figures = draw(lambda: watch_plot(timeline, run.directory / "watch.png"))
    sections = [headline_section(timeline), findings_section(diagnosis, "engine instance(s)")]
    if figures:
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    sections.append(scrapes_section(timeline))
    extra = [Fact("endpoint", timeline.url, code=True)] if timeline.url else []
    if header is not None and header.interval_s:
        extra.append(Fact("scrape interval", f"{header.interval_s:g} s"))
    sections.append(provenance_section(header.meta if header is not None else {}, run.files(), extra))
    return Page("watch", title, subtitle, [], sections)


def verdict(timeline: Timeline) -> Verdict:
    summaries = {source: InstanceSummary.of(w.samples) for source, w in timeline.windows.items()}
    peaks = [(s.usage_peak, source) for source, s in summaries.items() if s.usage_peak is not None]
    scrapes = max(s.scrapes for s in summaries.values())
    span = max(s.span_s for s in summaries.values())
    if peaks:
        peak, source = max(peaks)
        headline = f"KV cache usage peaked at {units.share(peak)} ({source}) over {scrapes} scrapes in {seconds(span)}"
        tone = "warn" if peak > 0.9 else "neutral"
    else:
        headline = f"{scrapes} scrapes over {seconds(span)}; the engine exposes no KV usage"
        tone = "neutral"
    sentences = []
    for source, s in summaries.items():
        parts = [
            f"mean KV usage {units.share(s.usage_mean)}" if s.usage_mean is not None else None,
            f"at most {units.count(s.running_peak)} running" if s.running_peak is not None else None,
            f"at most {units.count(s.waiting_peak)} waiting" if s.waiting_peak is not None else None,
            f"{units.count(s.preemptions)} new preemptions" if s.preemptions is not None else None,
        ]
        sentences.append(f"{source}: {', '.join(p for p in parts if p)}.")
    if timeline.errors:
        sentences.append(f"{timeline.errors} scrape(s) failed and are left out.")
        tone = "warn"
    return Verdict(headline, tone, sentences)


SUMMARY_COLUMNS = [
    Column("instance", False),
    Column("engine", False),
    Column("scrapes"),
    Column("span (s)"),
    Column("KV usage, mean (%)"),
    Column("KV usage, peak (%)"),
    Column("running, peak"),
    Column("waiting, peak"),
    Column("new preemptions"),
]


def headline_section(timeline: Timeline) -> Section:
    rows = []
    for source, window in timeline.windows.items():
        s = InstanceSummary.of(window.samples)
        rows.append(
            [
                Cell(source, field="instance"),
                Cell(s.family, field="engine"),
                Cell(units.count(s.scrapes), s.scrapes, field="scrapes"),
                Cell(units.num(s.span_s), s.span_s, field="span_s"),
                Cell(
                    units.num(100 * s.usage_mean) if s.usage_mean is not None else units.MISSING,
                    units.sort_key(s.usage_mean),
                    field="usage_mean",
                ),
                Cell(
                    units.num(100 * s.usage_peak) if s.usage_peak is not None else units.MISSING,
                    units.sort_key(s.usage_peak),
                    field="usage_peak",
                ),
                Cell(units.count(s.running_peak), units.sort_key(s.running_peak), field="running_peak"),
                Cell(units.count(s.waiting_peak), units.sort_key(s.waiting_peak), field="waiting_peak"),
                Cell(units.count(s.preemptions), units.sort_key(s.preemptions), field="preemptions"),
            ]
        )
    blocks: list[Any] = [
        verdict(timeline),
        Table("Each engine instance over the watch", SUMMARY_COLUMNS, rows, id="headline-table"),
    ]
    if timeline.torn:
        blocks.append(
            Text(
                ["The timeline's last line was cut short (the watch was stopped while writing) and is left out."],
                tone="warn",
            )
        )
    return Section("headline", "Verdict", blocks)


SCRAPE_COLUMNS = [
    Column("time (s)"),
    Column("KV usage (%)"),
    Column("free blocks"),
    Column("running"),
    Column("waiting"),
    Column("preemptions (total)"),
    Column("prefix hit rate (%)"),
]


def scrapes_section(timeline: Timeline) -> Section:
    subsections = []
    for index, (source, window) in enumerate(timeline.windows.items()):
        samples = window.samples[-MAX_ROWS:]
        rows = []
        for elapsed, s in samples:
            hit = s.hit_rate
            rows.append(
                [
                    Cell(units.num(elapsed), elapsed),
                    Cell(
                        units.num(100 * s.usage) if s.usage is not None else units.MISSING,
                        units.sort_key(s.usage),
                        "bad" if s.free_share is not None and s.free_share < 0.1 else "",
                    ),
                    Cell(units.count(s.free_blocks), units.sort_key(s.free_blocks)),
                    Cell(units.count(s.running), units.sort_key(s.running)),
                    Cell(units.count(s.waiting), units.sort_key(s.waiting)),
                    Cell(units.count(s.preemptions), units.sort_key(s.preemptions)),
                    Cell(units.num(100 * hit) if hit is not None else units.MISSING, units.sort_key(hit)),
                ]
            )
        note = f"The last {MAX_ROWS} of {len(window.samples)} scrapes." if len(window.samples) > MAX_ROWS else ""
        subsections.append(
            Section(
                f"scrapes-{index + 1}",
                source,
                [Table(f"Scrapes of {source}", SCRAPE_COLUMNS, rows, note=note)],
            )
        )
    return Section("points", "Per scrape", [], subsections)
