"""Listening to a server's KV event stream (vLLM's ZMQ PUB, or ``kvbench serve --kv-events``) beside a load.

A thread owns the sockets: a SUB socket on the stream and, when the server offers one, a DEALER socket for its
replay endpoint. The SUB socket connects to a server that binds its stream (``kvbench serve``, vLLM on an ipc:// or
wildcard address), or binds the address itself for a server that connects to it (``bind``: vLLM connects to a
``tcp://HOST:PORT`` it is given, so kvbench listens there on 127.0.0.1 rather than vLLM on every interface). Every
batch is kept in arrival order with its sequence number, the server's time and ours. A batch whose sequence number
skips ahead means batches were lost on the way (PUB drops what a slow reader cannot take): they are asked for again
from the replay endpoint and put back in their place; what the server no longer keeps stays a gap, counted. Joining
a stream already running, the history is asked for from sequence 0, so the server's resident blocks can be rebuilt
from its start when it still keeps them.

Nothing a server sends can stop the listening or grow it without bound: a batch that is not a KV event batch
is counted and set aside with its reason, and past ``max_events`` events the rest are counted, not kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from kvbench.measure.kv_events import (
    END_OF_REPLAY,
    MAX_KEPT_EVENTS,
    EventBatch,
    EventLog,
    MalformedBatch,
    ReceivedBatch,
    decode_batch,
    sequence_bytes,
    sequence_of,
)
from kvbench.measure.kv_residency import Change, rebuild
from kvbench.results.servers import ServerState

EVENT_DELIVERY_S = 0.2  # an event may reach us this long after a scrape showed its effect (another socket)
REPLAY_TIMEOUT_S = 2.0  # a replay answer that does not end by then is given up (the gap stays)
POLL_S = 0.05


class KvEventSubscriber:
    """``start`` connects and listens in a thread; ``stop`` ends it and returns the :class:`EventLog`."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        max_events: int = MAX_KEPT_EVENTS,
        bind: bool = False,
        on_batch: Callable[[EventBatch], None] | None = None,
    ) -> None:
        """``on_batch``: called in the listening thread with every batch, in sequence order, kept or not (a
        router's live view of the server's blocks)."""
        self.on_batch = on_batch
        self.log = EventLog(endpoint, replay_endpoint, time.time(), bound=bind, max_events=max_events)
        self._topic = topic.encode()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-event-subscriber", daemon=True)
        self._error: BaseException | None = None
        self._next: int | None = None  # the sequence number expected next

    def start(self, settle_s: float = 0.2) -> KvEventSubscriber:
        """Connect (or bind) and wait ``settle_s`` for the subscription to reach the server (ZMQ's slow-joiner
        delay; a server that connects to a bound socket retries every 100 ms, so that wait is longer). An address
        that cannot be bound raises OSError with the reason."""
        self._thread.start()
        self._ready.wait(5.0)
        if self._error is not None:
            self._thread.join(5.0)
            raise OSError(f"cannot listen for KV events on {self.log.endpoint}: {self._error}")
        time.sleep(max(settle_s, 0.5) if self.log.bound else settle_s)
        return self

    def stop(self, drain_s: float = 0.3) -> EventLog:
        """Take what is still in flight for ``drain_s``, then end the thread and return the log."""
        time.sleep(drain_s)
        self._stop.set()
        self._thread.join(10.0)
        self.log.stopped_s = time.time()
        if self._error is not None:
            raise self._error
        return self.log

    # -- the thread -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        context = zmq.Context()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.MAXMSGSIZE, 64 * 1024**2)  # a larger message closes the connection, never the memory
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        try:
            if self.log.bound:
                sub.bind(self.log.endpoint)
            else:
                sub.connect(self.log.endpoint)
            self._ready.set()
            while not self._stop.is_set():
                if not sub.poll(int(POLL_S * 1000)):
                    continue
                while not self._stop.is_set():
                    try:
                        frames = sub.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._take(frames, context)
        except BaseException as err:  # noqa: BLE001 - given to the caller by start() or stop()
            self._error = err
        finally:
            self._ready.set()
            sub.close(0)
            context.term()

    def _take(self, frames: list[bytes], context: zmq.Context) -> None:
        """One message from the stream: decoded, checked against the sequence, gaps filled."""
        now = time.time()
        if len(frames) != 3:
            self._malformed(f"a message of {len(frames)} frames (3 expected: topic, sequence, batch)")
            return
        try:
            seq = sequence_of(frames[1])
            batch = decode_batch(frames[2])
        except MalformedBatch as err:
            self._malformed(str(err))
            return
        expected = self._next
        if expected is None:  # the first batch heard: ask for the history before it
            if seq == 0:
                self.log.history_complete = True
            elif self.log.replay_endpoint is not None:
                self.log.history_complete = self._replay(context, 0, seq, now - batch.ts, now) == seq
        elif seq == 0 and expected > 0:  # the server started again: its blocks are gone with it
            self.log.restarts += 1
        elif seq < expected:
            return  # already have it (a replay overlapped the stream)
        elif seq > expected:
            recovered = 0
            if self.log.replay_endpoint is not None:
                recovered = self._replay(context, expected, seq, now - batch.ts, now)
            self.log.lost_batches += seq - expected - recovered
        self._keep(ReceivedBatch(seq, now, batch))
        self._next = seq + 1

    def _replay(self, context: zmq.Context, start: int, end: int, offset_s: float, now: float) -> int:
        """Ask the replay endpoint for batches ``start`` .. ``end - 1``; keep what comes; return how many. A
        replayed batch is placed in time by its server time plus ``offset_s`` (our clock minus the server's, as
        the batch that revealed the gap measured it), between the last batch kept and ``now``."""
        assert self.log.replay_endpoint is not None
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, 64 * 1024**2)
        recovered = 0
        try:
            dealer.connect(self.log.replay_endpoint)
            dealer.send_multipart((b"", sequence_bytes(start)))
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            expected = start
            while (left := deadline - time.monotonic()) > 0 and dealer.poll(int(left * 1000)):
                frames = dealer.recv_multipart()
                if len(frames) != 4:  # (empty delimiter, topic, sequence, batch)
                    self._malformed(f"a replay message of {len(frames)} frames (4 expected)")
                    break
                try:
                    seq = sequence_of(frames[2])
                    if seq == END_OF_REPLAY:
                        break
                    batch = decode_batch(frames[3])
                except MalformedBatch as err:
                    self._malformed(f"in a replay: {err}")
                    break
                if seq >= end:
                    break  # the live stream brings these
                if seq != expected:  # the server no longer keeps the ones before: they stay lost
                    if seq < expected:
                        continue
                    expected = seq
                earliest = self.log.batches[-1].received_s if self.log.batches else self.log.started_s
                placed = min(now, max(earliest, batch.ts + offset_s))
                self._keep(ReceivedBatch(seq, placed, batch, replayed=True))
                recovered += 1
                expected = seq + 1
        finally:
            dealer.close(0)
        self.log.replayed_batches += recovered
        return recovered

    def _keep(self, received: ReceivedBatch) -> None:
        if self.on_batch is not None:
            self.on_batch(received.batch)
        count = len(received.batch.events)
        self.log.events += count
        if self.log.events > self.log.max_events:
            self.log.dropped_events += count
            return
        self.log.batches.append(received)

    def _malformed(self, reason: str) -> None:
        self.log.malformed += 1
        if self.log.malformed_reason is None:
            self.log.malformed_reason = reason


def event_figures(
    log: EventLog,
    kv_changes: list[Change],
    window_s: float,
    load_start_s: float,
    load_duration_s: float,
    scrapes: list[tuple[float, list[ServerState]]],
) -> dict[str, Any]:
    """A point's KV event figures: the stream's health, the residency over the load (from ``load_start_s``,
    Unix seconds, for ``load_duration_s``), and the resident blocks against what each scrape said."""
    residency = rebuild(kv_changes, window_s, log.history_complete, load_duration_s, load_start_s)
    figures = residency.summary()
    if not log.received_any:  # nothing heard is not "nothing evicted": no figure stands
        figures = dict.fromkeys(figures)
    out: dict[str, Any] = {
        "endpoint": log.endpoint,
        "replay_endpoint": log.replay_endpoint,
        "batches": len(log.batches),
        "events": log.events,
        "lost_batches": log.lost_batches,
        "replayed_batches": log.replayed_batches,
        "malformed": log.malformed,
        "malformed_reason": log.malformed_reason,
        "dropped_events": log.dropped_events,
        "restarts": log.restarts,
        "history_complete": log.history_complete,
        **figures,
    }
    cached_gaps, usage_gaps, at_rest = [], [], []
    for at, states in scrapes:
        resident = residency.resident_at(at)
        cached = [s.cached_blocks for s in states if s.cached_blocks is not None]
        if cached:
            cached_gaps.append(resident - sum(cached))
            if all(s.running == 0 and not s.waiting for s in states):  # nothing in flight: both sides settled,
                # the events allowed the moment they take to arrive (another socket than the metrics')
                late = residency.resident_at(at + EVENT_DELIVERY_S)
                at_rest.append(min(resident - sum(cached), late - sum(cached), key=abs))
        total = sum(s.total_blocks or 0 for s in states)
        usage = [s.usage for s in states if s.usage is not None]
        if total and usage:
            usage_gaps.append(resident / total - sum(usage) / len(usage))
    # under load the server's gauge lags its events by up to its stats interval: the gap at rest is the check
    out["resident_minus_server_cached_blocks_max"] = max(cached_gaps, key=abs) if cached_gaps else None
    out["resident_minus_server_cached_blocks_at_rest"] = max(at_rest, key=abs) if at_rest else None
    out["resident_share_minus_usage_max"] = max(usage_gaps, key=abs) if usage_gaps else None
    out["flag"] = stream_flag(log, load_duration_s)
    return out


def stream_flag(log: EventLog, listened_s: float) -> str | None:
    """What makes the stream's figures partial or absent, in one line; None when nothing does."""
    if not log.received_any and log.bound:
        return (
            f"no KV event arrived on {log.endpoint} (listened there) in {listened_s:.0f} s of load: the server "
            "does not connect to it (vLLM connects to the tcp://HOST:PORT its KV events config names), or it "
            "stored nothing"
        )
    if not log.received_any:
        return (
            f"no KV event arrived from {log.endpoint} in {listened_s:.0f} s of load: the server does not publish "
            "there (vLLM binds only an ipc:// or wildcard address; it connects to a tcp://HOST:PORT, which kvbench "
            "must then listen on), or it stored nothing"
        )
    problems = []
    if log.malformed:
        problems.append(f"{log.malformed} message(s) were not KV event batches ({log.malformed_reason})")
    if log.lost_batches:
        problems.append(f"{log.lost_batches} batch(es) were lost and not replayed")
    if log.dropped_events:
        problems.append(f"{log.dropped_events:,} events past the {log.max_events:,} kept were counted, not kept")
    if log.restarts:
        problems.append(f"the server's stream started again {log.restarts} time(s)")
    if not log.history_complete:
        problems.append("the stream's earlier batches were not available: resident counts are lower bounds")
    return "; ".join(problems) or None
