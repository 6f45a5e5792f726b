"""Render a Comparison: Markdown (PR comment / CI job summary), JSON, JUnit XML, or a rich table."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from enum import Enum

from rich.console import Console
from rich.table import Table

from kvbench.fileio import json_text
from kvbench.report.compare import STATUS_METRIC, Comparison, Row, Verdict

COLUMNS = ("point", "metric", "base", "head", "change", "verdict", "rule")
VERDICT_ORDER = (Verdict.REGRESSED, Verdict.MISSING, Verdict.IMPROVED, Verdict.NEW, Verdict.INFO, Verdict.UNCHANGED)
CHANGED = (Verdict.REGRESSED, Verdict.MISSING, Verdict.IMPROVED, Verdict.NEW)
VERDICT_STYLE = {
    Verdict.REGRESSED: "bold red",
    Verdict.MISSING: "bold red",
    Verdict.IMPROVED: "green",
    Verdict.NEW: "cyan",
    Verdict.INFO: "yellow",
    Verdict.UNCHANGED: "dim",
}


class ReportFormat(str, Enum):
    markdown = "markdown"
    json = "json"
    junit = "junit"
    table = "table"


def render(comparison: Comparison, fmt: ReportFormat) -> str:
    if fmt is ReportFormat.markdown:
        return to_markdown(comparison)
    if fmt is ReportFormat.json:
        return to_json(comparison)
    if fmt is ReportFormat.junit:
        return to_junit(comparison)
    buffer = io.StringIO()
    Console(file=buffer, width=160, color_system=None).print(to_rich_table(comparison))
    return buffer.getvalue()


SUMMARY_ROWS = 10  # changed rows the terminal summary lists before pointing at the full report


def to_summary(comparison: Comparison) -> str:
    """A few lines for a terminal or a CI log: the verdict, the notes, what changed (the first
    :data:`SUMMARY_ROWS`); the command says where the full table is."""
    changed = sorted(
        (row for row in comparison.rows if row.verdict in CHANGED), key=lambda row: VERDICT_ORDER.index(row.verdict)
    )
    lines = [summary_line(comparison), *(f"note: {note}" for note in comparison.notes)]
    for row in changed[:SUMMARY_ROWS]:
        change = format_change(row)
        lines.append(
            f"  {row.verdict.value}: {row.point.label} {row.metric} {format_value(row.base)} -> "
            f"{format_value(row.head)}" + (f", {change}" if change else "") + (f"; {row.note}" if row.note else "")
        )
    if len(changed) > SUMMARY_ROWS:
        lines.append(f"  ... and {len(changed) - SUMMARY_ROWS} more")
    short = sum(row.verdict is Verdict.INFO and row.note.startswith("too short") for row in comparison.rows)
    if short:
        lines.append(f"  {short} timing metric(s) of points too short to judge on this machine: reported, not gated")
    return "\n".join(lines) + "\n"


def summary_line(comparison: Comparison) -> str:
    """``kvbench compare: FAIL - 1 regressed, 1 missing, ...``: the verdict and the count of each kind."""
    parts = ", ".join(f"{comparison.count(v)} {v.value}" for v in VERDICT_ORDER)
    return f"kvbench compare: {'FAIL' if comparison.failed else 'PASS'} - {parts}"


def format_value(value: float | str | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def format_change(row: Row) -> str:
    if row.metric == STATUS_METRIC:
        return "" if row.base == row.head else f"{row.base} -> {row.head}"
    delta = row.delta
    if delta is None:
        return ""
    if delta == 0:
        return "0"
    text = f"{delta:+,.0f}" if abs(delta) >= 1e4 else f"{delta:+.4g}"
    relative = row.relative_change
    return text if relative is None else f"{text} ({relative:+.1%})"


def format_rule(row: Row) -> str:
    return "; ".join(part for part in (row.threshold, row.note) if part)


def cells(row: Row) -> tuple[str, ...]:
    return (
        row.point.label,
        row.metric,
        format_value(row.base),
        format_value(row.head),
        format_change(row),
        row.verdict.value,
        format_rule(row),
    )


def policy_line(comparison: Comparison) -> str:
    if comparison.simulated:
        return "simulated runs: every metric is deterministic and judged exactly"
    return "measured runs: counts and peak bytes judged exactly, timing-dependent metrics within noise tolerances"


def to_markdown(comparison: Comparison) -> str:
    changed = sorted(
        (row for row in comparison.rows if row.verdict in CHANGED),
        key=lambda row: VERDICT_ORDER.index(row.verdict),
    )
    lines = [
        f"**{summary_line(comparison)}**",
        "",
        f"base `{comparison.base.path}` - head `{comparison.head.path}` - kind `{comparison.head.kind}`"
        f" - {policy_line(comparison)}",
        *(f"> note: {note}" for note in comparison.notes),
        "",
    ]
    lines += _markdown_table(changed) if changed else ["No change beyond the thresholds.", ""]
    for verdict, title in ((Verdict.INFO, "reported, not gated"), (Verdict.UNCHANGED, "unchanged")):
        rows = [row for row in comparison.rows if row.verdict is verdict]
        if rows:
            lines += [f"<details><summary>{len(rows)} {title}</summary>", "", *_markdown_table(rows), "</details>", ""]
    return "\n".join(lines)


def _markdown_table(rows: list[Row]) -> list[str]:
    def line(values: tuple[str, ...]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    def marked(row: Row) -> tuple[str, ...]:
        values = cells(row)
        if not row.verdict.fails:
            return values
        verdict_at = COLUMNS.index("verdict")
        return (*values[:verdict_at], f"**{values[verdict_at]}**", *values[verdict_at + 1 :])

    return [line(COLUMNS), "|" + "---|" * len(COLUMNS), *(line(marked(row)) for row in rows), ""]


def to_json(comparison: Comparison) -> str:
    document = {
        "base": str(comparison.base.path),
        "head": str(comparison.head.path),
        "kind": comparison.head.kind,
        "failed": comparison.failed,
        "alpha": comparison.alpha,
        "simulated": comparison.simulated,
        "counts": comparison.counts,
        "notes": list(comparison.notes),
        "rows": [
            {
                **row.point._asdict(),
                "metric": row.metric,
                "base": row.base,
                "head": row.head,
                "change": row.delta,
                "relative_change": row.relative_change,
                "threshold": row.threshold,
                "p_value": row.p_value,
                "verdict": row.verdict.value,
                "note": row.note,
            }
            for row in comparison.rows
        ],
    }
    return json_text(document) + "\n"


def to_junit(comparison: Comparison) -> str:
    """One test case per compared metric; regressions and missing points or metrics are failures."""
    tests, failures = str(len(comparison.rows)), str(sum(row.verdict.fails for row in comparison.rows))
    root = ET.Element("testsuites", name="kvbench compare", tests=tests, failures=failures, errors="0")
    suite = ET.SubElement(
        root,
        "testsuite",
        name=f"kvbench compare ({comparison.head.kind})",
        tests=tests,
        failures=failures,
        errors="0",
        skipped="0",
    )
    for row in comparison.rows:
        case = ET.SubElement(suite, "testcase", classname=f"kvbench.compare.{row.point.label}", name=row.metric)
        message = f"{row.verdict.value}: base {format_value(row.base)}, head {format_value(row.head)}"
        if format_change(row):
            message += f", change {format_change(row)}"
        if format_rule(row):
            message += f" [{format_rule(row)}]"
        if row.verdict.fails:
            ET.SubElement(case, "failure", message=message, type=row.verdict.value).text = message
        else:
            ET.SubElement(case, "system-out").text = message
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def to_rich_table(comparison: Comparison) -> Table:
    caption = "\n".join((policy_line(comparison), *comparison.notes))
    table = Table(title=summary_line(comparison), caption=caption)
    for column in COLUMNS:
        table.add_column(column, justify="right" if column in ("base", "head", "change") else "left")
    for row in comparison.rows:
        table.add_row(*cells(row), style=VERDICT_STYLE[row.verdict])
    return table
