"""``kvbench watch``: a live view of a serving engine's KV cache, recorded as a timeline and a plot."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.live import Live

from kvbench.commands._flags import METRICS_URL, OUT, SCRAPE_INTERVAL
from kvbench.commands._kv_event_options import KV_EVENTS, KV_EVENTS_BIND, KV_EVENTS_REPLAY, listening
from kvbench.commands._options import make_console, run_directory
from kvbench.endpoint.kv_event_subscriber import KvEventSubscriber, event_figures
from kvbench.errors import KvbenchError
from kvbench.fileio import DirectoryLock, write_text_atomic
from kvbench.measure.kv_events import changes
from kvbench.measure.kv_residency import DEFAULT_THRASH_WINDOW_S, kv_events_text
from kvbench.report.diagnose.watch_timeline import read_timeline
from kvbench.report.html import write_report_after_run
from kvbench.report.rundir import new_run_dir
from kvbench.report.watch_report import WatchView, watch_plot
from kvbench.results.watch_records import TIMELINE_FILE
from kvbench.studies.watch import Scrape, WatchSettings, read_endpoint, watch

HELP = """Watch a live metrics endpoint's KV cache, recorded as a timeline and a plot.

Watch a live kvbench, vLLM or SGLang metrics endpoint: KV usage, free blocks, running and waiting
requests, preemptions and the prefix-cache hit rate, scraped every --scrape-interval seconds and shown as a live
table. Each scrape is appended to OUT/timeline.jsonl as it comes; when the watch ends (--duration, or Ctrl-C)
OUT/watch.png plots the timeline and OUT/report.html shows it with its diagnosis. `kvbench diagnose
OUT/timeline.jsonl` runs the diagnosis rules over it (a queue that grows while KV usage stays low is seen only
over time). With --kv-events the server's KV event stream is listened to as well: blocks stored and removed per
second, resident blocks and thrash shown live, and the events kept in OUT/kv-events.jsonl.
"""


MAX_DURATION_S = 30 * 86400.0  # a month, bounded (an infinite one is the default: until Ctrl-C)


def register(app: typer.Typer) -> None:
    app.command("watch", help=HELP)(watch_command)


def watch_command(
    url: str = METRICS_URL(...),
    interval: float = SCRAPE_INTERVAL(1.0),
    duration: float | None = typer.Option(
        None,
        "--duration",
        min=0.0,
        max=MAX_DURATION_S,
        help="Stop after this many seconds, at most 30 days (default: at Ctrl-C).",
    ),
    out: str | None = OUT(None, "Folder for timeline.jsonl and watch.png (default reports/watch-<time>)."),
    kv_events: Annotated[str | None, KV_EVENTS] = None,
    kv_events_bind: Annotated[bool, KV_EVENTS_BIND] = False,
    kv_events_replay: Annotated[str | None, KV_EVENTS_REPLAY] = None,
) -> None:
    listen = listening(kv_events, kv_events_replay, kv_events_bind)
    first = read_endpoint(url)  # a URL that is down or not a metrics page fails here, before any file is made
    out_dir = new_run_dir("watch", run_directory(out))
    timeline = out_dir / TIMELINE_FILE
    if timeline.exists():
        raise KvbenchError(f"{out_dir} already holds a timeline; choose another --out")
    lock = DirectoryLock(out_dir, "kvbench watch")
    console = make_console()
    listener = None
    if listen is not None:
        try:
            listener = KvEventSubscriber(listen.endpoint, listen.replay, bind=listen.bind).start()
        except OSError as err:
            lock.release()
            raise KvbenchError(str(err)) from None
    view = WatchView(url, interval, duration, events=listener.log if listener is not None else None)
    interrupted = False
    with Live(view.render(), console=console, refresh_per_second=4, transient=False) as live:

        def on_scrape(scrape: Scrape) -> None:
            view.add(scrape.elapsed_s, scrape.states, scrape.error)
            live.update(view.render())

        try:
            watch(WatchSettings(url, interval, duration, timeline), first, on_scrape)
        except KeyboardInterrupt:
            interrupted = True
    console.line()
    if listener is not None:
        log = listener.stop()
        kept = changes(log)
        figures = event_figures(log, kept, DEFAULT_THRASH_WINDOW_S, log.started_s, log.stopped_s - log.started_s, [])
        write_text_atomic(out_dir / "kv-events.jsonl", kv_events_text(figures, kept))
        if figures["flag"]:
            console.print(f"[yellow]KV events: {figures['flag']}[/yellow]")
    recorded = read_timeline(timeline)
    plot = watch_plot(recorded, out_dir / "watch.png")
    report = write_report_after_run(out_dir)
    lock.release()
    stopped = "stopped by Ctrl-C; " if interrupted else ""
    console.print(
        f"{stopped}wrote {timeline} ({view.scrapes} scrape(s)), {plot}"
        + (f" and {report.path}" if report is not None else "")
    )
    console.print(f"diagnose it: kvbench diagnose {timeline}")
