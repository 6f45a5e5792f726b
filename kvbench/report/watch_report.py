"""``kvbench watch`` on the terminal (a live table per engine instance) and as a PNG afterwards."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kvbench.measure.kv_events import EventLog, changes_of
from kvbench.measure.kv_residency import DEFAULT_THRASH_WINDOW_S, Tracker
from kvbench.report.diagnose.watch_timeline import Timeline
from kvbench.results.servers import ServerState
from kvbench.units import count, share


def _flagged(state: ServerState, fields: tuple[str, ...], cell: str | Text) -> str | Text:
    """The cell, or "invalid" where the engine reported one of ``fields`` outside its meaning."""
    return Text("invalid", style="magenta") if any(f in state.invalid for f in fields) else cell


class WatchView:
    """The last ``rows`` scrapes of each engine instance, newest last, redrawn after every scrape."""

    def __init__(
        self, url: str, interval_s: float, duration_s: float | None, rows: int = 12, events: EventLog | None = None
    ) -> None:
        self.url = url
        self.events = events  # a KV event stream being listened to (its log grows in the listener's thread)
        self._seen = 0  # batches of the log applied so far
        self._tracker: Tracker | None = None
        self._events_at = 0.0
        self.event_line: str | None = None
        self.interval_s = interval_s
        self.duration_s = duration_s
        self.rows = rows
        self.history: dict[str, deque[tuple[float, ServerState]]] = {}
        self.previous: dict[str, ServerState] = {}
        self.scrapes = 0
        self.failed = 0
        self.last_error: str | None = None

    def add(self, elapsed_s: float, states: list[ServerState], error: str | None) -> None:
        self.scrapes += 1
        if self.events is not None:
            self._take_events(elapsed_s)
        if error is not None:
            self.failed += 1
            self.last_error = error
            return
        self.last_error = None
        for state in states:
            self.history.setdefault(state.source, deque(maxlen=self.rows)).append((elapsed_s, state))

    def _take_events(self, elapsed_s: float) -> None:
        """Stored and removed blocks per second since the last scrape, resident blocks and thrash so far."""
        log = self.events
        assert log is not None
        if self._tracker is None:
            self._tracker = Tracker(DEFAULT_THRASH_WINDOW_S, log.history_complete)
        result = self._tracker.result
        stored, removed = result.stored, result.removed + result.removed_unknown
        batches = log.batches[self._seen :]  # the listener appends as it goes: take what is there now
        self._seen += len(batches)
        for change in changes_of(batches):
            self._tracker.apply(change)
        span = elapsed_s - self._events_at if self.scrapes > 1 else 0.0
        self._events_at = elapsed_s
        rates = ""
        if span > 0:
            now_removed = result.removed + result.removed_unknown
            rates = (
                f"{(result.stored - stored) / span:,.0f} stored/s, {(now_removed - removed) / span:,.0f} removed/s; "
            )
        thrash = result.thrash_share
        self.event_line = (
            f"KV events: {rates}{result.resident_end:,} blocks resident; {result.removed:,} removed so far"
            + (f", {thrash:.0%} stored again within {DEFAULT_THRASH_WINDOW_S:g} s" if thrash is not None else "")
            + ("" if log.received_any else f" (nothing received yet from {log.endpoint})")
        )

    def render(self) -> Group:
        until = f"for {self.duration_s:g} s" if self.duration_s is not None else "until Ctrl-C"
        header = Text.from_markup(
            f"[bold]kvbench watch[/bold] {escape(self.url)}: every {self.interval_s:g} s "
            f"{until}; {self.scrapes} scrape(s)" + (f", [red]{self.failed} failed[/red]" if self.failed else "")
        )
        parts: list = [header]
        if self.event_line:
            parts.append(Text(self.event_line))
        if self.last_error:
            parts.append(Text(f"last scrape failed: {self.last_error}", style="red"))
        parts += [self._table(source, rows) for source, rows in self.history.items()]
        return Group(*parts)

    def _table(self, source: str, rows: deque[tuple[float, ServerState]]) -> Table:
        table = Table(title=Text(source), title_justify="left")  # a Text: label values are not markup
        for column in ("t (s)", "KV usage", "free blocks", "running", "waiting", "preemptions (+new)", "prefix hits"):
            table.add_column(column, justify="right")
        before: ServerState | None = None
        for elapsed, state in rows:
            usage = share(state.usage, missing="-")
            style = "red" if state.free_share is not None and state.free_share < 0.1 else None
            new = ""
            if before is not None and before.preemptions is not None and state.preemptions is not None:
                new = f" (+{max(0.0, state.preemptions - before.preemptions):.0f})"
            hit = state.hit_rate
            table.add_row(
                f"{elapsed:,.1f}",
                _flagged(state, ("usage",), Text(usage, style=style or "")),
                _flagged(state, ("usage", "total_blocks"), count(state.free_blocks, missing="-")),
                _flagged(state, ("running",), count(state.running, missing="-")),
                _flagged(state, ("waiting",), count(state.waiting, missing="-")),
                _flagged(state, ("preemptions",), count(state.preemptions, missing="-") + new),
                _flagged(state, ("prefix_queries", "prefix_hits", "prefix_hit_rate"), share(hit, missing="-")),
            )
            before = state
        if any(state.invalid for _, state in rows):
            table.caption = "invalid: the engine reported a value outside its meaning (kvbench diagnose names it)"
        return table


def watch_plot(timeline: Timeline, path: Path, free_blocks_threshold: float = 0.1) -> Path:
    """KV usage, running/waiting requests and new preemptions per scrape over time, one line per instance."""
    from kvbench.report import plots  # matplotlib loads only when a plot is drawn

    usage, requests, preemptions = {}, {}, {}
    many = len(timeline.windows) > 1
    for source, window in timeline.windows.items():
        tag = f"{source} " if many else ""
        times = [t for t, _ in window.samples]
        states = [s for _, s in window.samples]
        if any(s.usage is not None for s in states):
            usage[f"{tag}KV usage".strip()] = _series(
                times, [None if s.usage is None else 100 * s.usage for s in states]
            )
        requests[f"{tag}running"] = _series(times, [s.running for s in states])
        requests[f"{tag}waiting"] = _series(times, [s.waiting for s in states])
        new = [None] + [
            None if a.preemptions is None or b.preemptions is None else max(0.0, b.preemptions - a.preemptions)
            for a, b in zip(states, states[1:], strict=False)
        ]
        if any(v is not None for v in new):
            preemptions[f"{tag}preemptions".strip()] = _series(times, new)
    sources = "; ".join(timeline.windows)
    return plots.stacked_panels(
        [
            (
                "KV cache usage: near 100% leaves no headroom for new requests (lower is safer)",
                "blocks in use (%)",
                usage,
                (100 * (1 - free_blocks_threshold), f"free blocks < {100 * free_blocks_threshold:g}% above this"),
            ),
            (
                "Requests: waiting (dashed) is lower-is-better; running higher is better while nothing waits",
                "requests",
                requests,
                None,
            ),
            ("New preemptions per scrape (lower is better)", "preemptions", preemptions, None),
        ],
        path,
        f"kvbench watch: {timeline.url or timeline.path}\n{sources}",
        "time since the first scrape (s)",
        y_ranges=[(0, 100), (0, None), (0, None)],
    )


def _series(times: list[float], values: list[float | None]) -> tuple[list[float], list[float]]:
    kept = [(t, v) for t, v in zip(times, values, strict=True) if v is not None]
    return [t for t, _ in kept], [v for _, v in kept]
