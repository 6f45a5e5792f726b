"""A request trace read for its lengths and arrival times, whichever form it takes: a lengths file (CSV or JSONL of
``prompt_len``/``output_len``, arrival times in seconds) or a hash-id trace (Mooncake's format, or a shipped one by
name, timestamps in milliseconds), so ``--trace`` means one thing to every command."""

from __future__ import annotations

from pathlib import Path

from kvbench import json_input
from kvbench.workload.arrivals import recorded_arrivals
from kvbench.workload.jsonl import read_text
from kvbench.workload.lengths import load_trace
from kvbench.workload.prefix_trace import builtin_traces, read_prefix_trace, resolve_trace

HASH_ID_FIELDS = ("hash_ids", "input_length")  # a row with these is a hash-id trace's


def trace_lengths(spec: str | Path) -> tuple[list[tuple[int, int]], list[float] | None]:
    """The trace's (prompt, output) lengths, and its arrival times in seconds from the first (None where the file
    records none). A hash-id trace's prefill-only request (0 output tokens) counts one: every request here generates."""
    path = resolve_trace(spec) if str(spec) in builtin_traces() else Path(spec)
    if _is_hash_id_trace(path):
        trace = read_prefix_trace(path)
        origin = trace.requests[0].arrival_s
        lengths = [(request.input_len, max(request.output_len, 1)) for request in trace.requests]
        return lengths, [request.arrival_s - origin for request in trace.requests]
    return load_trace(path), recorded_arrivals(path)


def _is_hash_id_trace(path: Path) -> bool:
    if path.suffix.lower() == ".csv" or not path.is_file():
        return False  # a missing file is refused by the lengths reader, naming it
    first = next((line for line in read_text(path, "trace file").splitlines() if line.strip()), "")
    try:
        row = json_input.loads(first)
    except ValueError:
        return False  # the lengths reader names the line it cannot read
    return isinstance(row, dict) and all(field in row for field in HASH_ID_FIELDS)
