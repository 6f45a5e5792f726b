"""A point's timeline: the server's scrapes and the client's throughput on one time axis, saved for plotting;
and the scrapes alone in ``kvbench watch``'s timeline format, so ``kvbench diagnose FILE`` judges a point as it
judges a watch.

The client series is binned (``bin_s``, the scrape interval by default): output tokens per second (a token event
carries the record's output tokens spread evenly over its events), requests completed and failed per
second, and requests in flight at the middle of each bin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvbench.endpoint.record import RequestRecord
from kvbench.endpoint.scraper import Scrape
from kvbench.endpoint.server_metrics import timeline_rows
from kvbench.fileio import write_json_atomic
from kvbench.measure.kv_residency import Change, rebuild
from kvbench.results.watch_records import append_records, error_record, header_record, sample_records

TIMELINE_VERSION = 1


def client_series(records: Sequence[RequestRecord], origin: float, end_s: float, bin_s: float) -> dict[str, list]:
    """Per bin from 0 to ``end_s``: its start (s), output tokens/s, completed/s, failed/s, in flight."""
    if not (bin_s > 0 and math.isfinite(end_s) and end_s >= 0):
        raise ValueError("bins need a positive width and a finite end")
    bins = max(1, math.ceil(end_s / bin_s))
    tokens = [0.0] * bins
    completed = [0] * bins
    failed = [0] * bins

    def index(t: float) -> int | None:
        k = int(t // bin_s)
        return k if 0 <= k < bins else (bins - 1 if k == bins and t <= end_s + 1e-9 else None)

    spans = []
    for record in records:
        start = record.start - origin
        end = (record.end if record.end is not None else record.start) - origin
        if record.ok and record.token_times:
            weight = (record.output_tokens or len(record.token_times)) / len(record.token_times)
            for t in record.token_times:
                if (k := index(start + t)) is not None:
                    tokens[k] += weight
        if record.error_kind not in ("skipped", "not_sent"):
            spans.append((start, end))
        if (k := index(end)) is not None:
            if record.ok:
                completed[k] += 1
            else:
                failed[k] += 1
    starts = [k * bin_s for k in range(bins)]
    in_flight = [sum(1 for a, b in spans if a <= s + bin_s / 2 < b) for s in starts]
    return {
        "t_s": starts,
        "output_tokens_per_s": [v / bin_s for v in tokens],
        "completed_per_s": [v / bin_s for v in completed],
        "failed_per_s": [v / bin_s for v in failed],
        "in_flight": in_flight,
    }


def point_timeline(
    records: Sequence[RequestRecord],
    scrapes: Sequence[Scrape],
    origin: float,
    end_s: float,
    bin_s: float,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON document of a point's timeline (``version``, ``meta``, ``bin_s``, ``client``, ``server``)."""
    return {
        "version": TIMELINE_VERSION,
        "meta": meta or {},
        "bin_s": bin_s,
        "duration_s": end_s,
        "client": client_series(records, origin, end_s, bin_s),
        "server": timeline_rows(scrapes),
    }


def write_point_timeline(path: str | Path, timeline: dict[str, Any]) -> Path:
    return write_json_atomic(path, timeline)


def write_watch_timeline(path: str | Path, url: str, interval_s: float, scrapes: Sequence[Scrape]) -> Path:
    """The scrapes as ``kvbench watch`` records them (JSONL, appended), for ``kvbench diagnose``."""
    target = Path(path)
    append_records(target, [header_record(url, interval_s)])
    for scrape in scrapes:
        if scrape.error is not None:
            append_records(target, [error_record(scrape.elapsed_s, url, scrape.error)])
        else:
            append_records(target, sample_records(scrape.elapsed_s, url, scrape.states))
    return target


def kv_series(
    changes: Sequence[Change], wall_origin: float, end_s: float, bin_s: float, most: int = 2000
) -> dict[str, list]:
    """The server's resident prefix-cache blocks (from its KV events) after each change within the load, seconds
    from its start, thinned to at most ``most`` points (the last of each stretch kept); and the blocks it removed
    per second in bins of ``bin_s`` (as the client series)."""
    residency = rebuild(changes, window_s=0.0, complete=True, count_from_s=wall_origin)
    points = [(at - wall_origin, count) for at, count in residency.series if 0.0 <= at - wall_origin <= end_s]
    step = max(1, math.ceil(len(points) / most))
    kept = points[step - 1 :: step] if step > 1 else points
    bins = max(1, math.ceil(end_s / bin_s))
    removed = [0] * bins
    for change in changes:
        at = change.at_s - wall_origin
        if change.kind == "R" and 0.0 <= at <= end_s:
            removed[min(bins - 1, int(at // bin_s))] += len(change.hashes)
    return {
        "t_s": [t for t, _ in kept],
        "resident_blocks": [count for _, count in kept],
        "bin_t_s": [k * bin_s for k in range(bins)],
        "removed_per_s": [count / bin_s for count in removed],
    }
