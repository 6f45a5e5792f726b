"""The live view of ``kvbench watch``: a value the engine reported outside its meaning reads "invalid"."""

from __future__ import annotations

import io

from rich.console import Console

from kvbench.report.watch_report import WatchView
from kvbench.results.servers import ServerState
from kvbench.results.validity import set_aside_invalid


def _rendered(view: WatchView) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(view.render())
    return console.export_text()


def test_an_invalid_value_reads_invalid_and_the_valid_ones_are_shown():
    view = WatchView("http://127.0.0.1:1/metrics", 1.0, None)
    state = set_aside_invalid(
        ServerState("vllm", {"engine": "0"}, total_blocks=100.0, usage=37.5, running=-3.0, waiting=4.0, preemptions=2.0)
    )
    view.add(0.0, [state], None)
    text = _rendered(view)
    row = next(line for line in text.splitlines() if line.strip().startswith("│ 0.0") or "0.0 │" in line)
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells == ["0.0", "invalid", "invalid", "invalid", "4", "2", "-"]
    assert "3750" not in text and "-3" not in text
    assert "invalid: the engine reported a value outside its meaning" in text
