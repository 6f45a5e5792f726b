"""A hash-id trace and the options that select it, declared once for the commands that read one (``reuse``, and
``sweep --target``, which replays it over HTTP): the file or shipped name, its block size and convention, and
which of its requests, how fast."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import replace
from typing import Any

import typer

from kvbench.commands import _flags
from kvbench.commands._options import choice
from kvbench.errors import KvbenchError
from kvbench.workload.prefix_trace import (
    CONVENTIONS,
    MAX_TIME_SCALE,
    PrefixTrace,
    builtin_traces,
    read_prefix_trace,
    resolve_trace,
)

SHIPPED_TRACE = "mooncake-conversation-1k"

# Annotated style (``name: Annotated[type, OPTION] = default``): the same declaration in every command's signature
TRACE = _flags.TRACE.annotated(
    f"Hash-id trace (JSONL: timestamp ms, input_length, output_length, hash_ids), or a shipped one: "
    f"{SHIPPED_TRACE} (the first 1,000 requests of Mooncake's conversation trace)."
)
TRACE_BLOCK_SIZE = typer.Option("--trace-block-size", min=1, help="Prompt tokens per hash id in the trace.")
TRACE_CONVENTION = typer.Option(
    "--trace-convention",
    help="per-request: each line lists every block of its prompt; cumulative: each line of a session_id "
    "lists the blocks its turn adds after the session's previous prompt.",
    **choice(CONVENTIONS, "trace convention"),
)
MAX_REQUESTS = typer.Option("--max-requests", min=1, help="Keep the trace's first N requests.")
WINDOW = typer.Option(
    "--window", help="Keep the trace's requests arriving in START:END seconds from its first arrival."
)
TIME_SCALE = typer.Option("--time-scale", help="Multiply the trace's arrival times (0.5: twice as fast).")
DEFAULT_CONVENTION = CONVENTIONS[0]


def in_panel(option: Any, panel: str) -> Any:
    """One of these options shown under a command's own help panel."""
    shown = copy.copy(option)
    shown.rich_help_panel = panel
    return shown


def load_prefix_trace(
    name: str, block_size: int, convention: str, max_requests: int | None, window: str | None, time_scale: float
) -> PrefixTrace:
    """The trace as the options select it (one-line errors naming the flag)."""
    trace = read_prefix_trace(resolve_trace(name), block_size, convention)
    if name in builtin_traces():
        trace = replace(trace, source=f"{name} (shipped with kvbench)")
    return subset(trace, max_requests, window, time_scale)


def subset(trace: PrefixTrace, max_requests: int | None, window: str | None, time_scale: float) -> PrefixTrace:
    """The requests ``--max-requests`` and ``--window`` keep, at ``--time-scale``."""
    if not (math.isfinite(time_scale) and 0 < time_scale <= MAX_TIME_SCALE):
        raise KvbenchError(f"--time-scale must be above 0 and at most {MAX_TIME_SCALE:,.0f}, got {time_scale!r}")
    return trace.subset(max_requests, parse_window(window) if window else None).scaled(time_scale)


def parse_window(text: str) -> tuple[float, float]:
    match = re.fullmatch(r"\s*([0-9.]+)\s*:\s*([0-9.]+|)\s*", text)
    try:
        start = float(match.group(1)) if match else math.nan
        end = float(match.group(2)) if match and match.group(2) else math.inf
    except ValueError:
        start = end = math.nan
    if not (math.isfinite(start) and start >= 0 and end > start):
        raise KvbenchError(
            f"--window: cannot read {text!r}; use START:END in seconds, e.g. 600:1200 (END may be left out)"
        )
    return start, end
