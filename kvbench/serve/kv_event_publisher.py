"""``kvbench serve``'s KV event stream: the prefix cache's stored, removed and cleared blocks, published over ZMQ
exactly as vLLM publishes its own (``measure.kv_events``), so one subscriber reads either server.

A PUB socket sends each batch as (topic, sequence, payload); an optional ROUTER socket answers a replay request
(a start sequence, 8 bytes) with every kept batch from there on, then the end marker, so a subscriber that
missed batches fills the gap. The engine process hands batches over without waiting: a thread owns both sockets
and sends them, so a slow or absent subscriber never holds up a step (PUB drops what no one reads).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

import zmq

from kvbench.kv.paged import CacheEvent
from kvbench.measure.kv_events import (
    END_OF_REPLAY,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    encode_batch,
    sequence_bytes,
)

REPLAY_KEEP = 10_000  # batches kept for replay (vLLM keeps as many by default)
QUEUE_LIMIT = 100_000  # batches waiting for the thread; past it the newest are dropped (and counted)
HIGH_WATER = 100_000  # ZMQ's own queue per subscriber


def wire_events(events: list[CacheEvent], block_size: int) -> list[Event]:
    """The manager's cache events in the wire's words."""
    out: list[Event] = []
    for event in events:
        if event.kind == "stored":
            out.append(BlockStored(list(event.hashes), event.parent, list(event.token_ids), block_size, None, "GPU"))
        elif event.kind == "removed":
            out.append(BlockRemoved(list(event.hashes), "GPU"))
        else:
            out.append(AllBlocksCleared())
    return out


class KvEventPublisher:
    """Batches out on ``endpoint`` (bound here), replays on ``replay_endpoint``; ``close`` sends what is queued."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "") -> None:
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(HIGH_WATER)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket | None = None
        try:
            self._pub.bind(endpoint)
            if replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay_endpoint)
        except zmq.ZMQError as err:
            self._close_sockets()
            raise OSError(f"cannot bind the KV event stream: {err}") from None
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT) if self._replay else None
        self._topic = topic.encode()
        self._queue: queue.Queue[EventBatch | None] = queue.Queue(QUEUE_LIMIT)
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_KEEP)
        self.dropped = 0  # batches the queue had no room for
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[Event]) -> None:
        """Queue one batch stamped now (never waits)."""
        try:
            self._queue.put_nowait(EventBatch(time.time(), events))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (for at most ``timeout_s``), then close the sockets."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(0)
        if self._replay is not None:
            self._replay.close(0)
        self._context.term()

    def _run(self) -> None:
        seq = 0
        while True:
            if self._replay is not None:
                while self._replay.poll(0):
                    self._answer_replay()
            try:
                batch = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if batch is None:
                return
            payload = encode_batch(batch)
            self._pub.send_multipart((self._topic, sequence_bytes(seq), payload))
            self._kept.append((seq, payload))
            seq += 1

    def _answer_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:  # (identity, empty delimiter, start): anything else is ignored
            return
        identity, start = frames[0], int.from_bytes(frames[2], "big", signed=True)
        for seq, payload in list(self._kept):
            if seq >= start:
                self._replay.send_multipart((identity, b"", self._topic, sequence_bytes(seq), payload))
        self._replay.send_multipart((identity, b"", b"", sequence_bytes(END_OF_REPLAY), b""))
