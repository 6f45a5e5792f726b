"""The waste report shows how requests ended and what a dataset's filter dropped, not only ``meta`` does:
the stop mode and the dropped records under the table and in summary.md, and the output lengths that
occurred (the sweep's renderer) when they came from real data or ended at EOS."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kvbench.report.waste_report import print_waste, waste_markdown
from kvbench.results.waste_study import WasteStudy
from kvbench.studies.waste import (
    STRATEGY_NAMES,
    WasteSettings,
    parse_strategies,
    run_waste_study,
    waste_workload,
)


def run_waste(**changes) -> WasteStudy:
    settings = WasteSettings(strategies=tuple(parse_strategies(list(STRATEGY_NAMES), [16])), **changes)
    return run_waste_study(settings, waste_workload(settings))


@pytest.fixture(scope="module")
def eos_document() -> WasteStudy:
    return run_waste(dataset="real-chat", stop="eos", max_len=1024, concurrency=16, requests_given=False)


def _console_text(document: WasteStudy, tmp_path) -> str:
    out = io.StringIO()
    print_waste(Console(file=out, width=200), document, tmp_path)
    return out.getvalue()


def test_summary_md_gives_stop_mode_dropped_records_and_output_lengths(eos_document):
    text = waste_markdown(eos_document)
    assert "Stop: eos: answers end at their real length" in text
    assert "Dataset: 48 requests from 48 of the 52 records of real-chat.json; left out: 4 shorter than 4 tokens" in text
    paged = next(p for p in eos_document.points if p.engine == "paged-16")
    lengths = (
        f"{paged.output_len_mean:,.0f} / {paged.output_len_p50:,.0f} / {paged.output_len_p90:,.0f} / "
        f"{paged.output_len_max:,}"
    )
    assert "## Output lengths ending at EOS" in text and f"| paged-16 | 16 | {lengths} | 48/48 |" in text


def test_the_console_table_says_the_stop_mode_and_what_was_left_out(eos_document, tmp_path):
    text = _console_text(eos_document, tmp_path)
    assert "stop eos; real-chat.json: 48 of 52 records, left out 4 shorter than 4 tokens" in text
    assert "Output lengths ending at EOS" in text and "output len mean/p50/p90/max" in text


def test_drawn_lengths_say_the_stop_mode_without_an_output_length_table(tmp_path):
    document = run_waste(requests=50, concurrency=8)
    text = waste_markdown(document)
    assert "Stop: length: every request runs to its drawn or reference output length" in text
    assert "Dataset:" not in text and "Output lengths" not in text
    assert "stop length" in _console_text(document, tmp_path)
