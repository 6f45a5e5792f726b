"""The KV event subscriber against a hostile or silent publisher: malformed messages, a flood, removals of blocks
never stored, a stream that starts again, nothing at all. Each ends in counts and a flag, never a hang, a crash
or a figure that is not one."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq

from kvbench.endpoint.kv_event_subscriber import KvEventSubscriber, event_figures, stream_flag
from kvbench.measure.kv_events import BlockRemoved, BlockStored, EventBatch, changes, encode_batch, sequence_bytes


@pytest.fixture()
def publisher(tmp_path):
    context = zmq.Context()
    socket = context.socket(zmq.PUB)
    socket.setsockopt(zmq.LINGER, 0)
    address = f"ipc://{tmp_path}/pub"
    socket.bind(address)
    yield socket, address
    socket.close(0)
    context.term()


def _send(socket, seq: int, payload: bytes) -> None:
    socket.send_multipart((b"", sequence_bytes(seq), payload))


def _batch(*events) -> bytes:
    return encode_batch(EventBatch(time.time(), list(events)))


def test_malformed_messages_are_counted_with_the_first_reason(publisher):
    socket, address = publisher
    listener = KvEventSubscriber(address).start()
    _send(socket, 0, b"\xc1 not msgpack")
    socket.send_multipart((b"", b"\x00"))  # two frames
    _send(socket, 1, msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": "x"}]]))
    _send(socket, 2, _batch(BlockStored([7], None, [1, 2], 2)))
    log = listener.stop()
    assert log.malformed == 3 and "not a KV event batch" in (log.malformed_reason or "")
    assert [b.seq for b in log.batches] == [2]
    assert "were not KV event batches" in (stream_flag(log, 1.0) or "")


def test_a_flood_is_counted_past_the_cap_and_listening_ends_promptly(publisher):
    socket, address = publisher
    listener = KvEventSubscriber(address, max_events=500).start()
    for seq in range(200):
        _send(socket, seq, _batch(*(BlockStored([seq * 10 + i], None, [], 2) for i in range(10))))
    started = time.monotonic()
    log = listener.stop()
    assert time.monotonic() - started < 5
    assert sum(len(b.batch.events) for b in log.batches) <= 500
    assert log.events == log.dropped_events + sum(len(b.batch.events) for b in log.batches)
    assert log.dropped_events > 0 and "counted, not kept" in (stream_flag(log, 1.0) or "")


def test_removals_of_unknown_blocks_and_a_joined_stream_give_lower_bounds(publisher):
    socket, address = publisher
    listener = KvEventSubscriber(address).start()
    _send(socket, 5, _batch(BlockRemoved([1, 2])))  # joined at 5 with no replay socket: history unknown
    _send(socket, 6, _batch(BlockStored([3], None, [], 2)))
    _send(socket, 9, _batch(BlockRemoved([3])))  # 7 and 8 lost
    log = listener.stop()
    assert not log.history_complete and log.lost_batches == 2
    figures = event_figures(log, changes(log), 10.0, 0.0, 10.0, [])
    assert figures["kv_blocks_removed_unknown"] == 2 and figures["kv_blocks_removed"] == 1
    assert "2 batch(es) were lost" in figures["flag"] and "lower bounds" in figures["flag"]


def test_a_stream_that_starts_again_is_counted(publisher):
    socket, address = publisher
    listener = KvEventSubscriber(address).start()
    for seq in (0, 1, 0):
        _send(socket, seq, _batch(BlockStored([seq + 100], None, [], 2)))
    log = listener.stop()
    assert log.restarts == 1 and "started again" in (stream_flag(log, 1.0) or "")


def test_a_server_that_never_publishes_gives_no_figure_and_a_flag(tmp_path):
    listener = KvEventSubscriber(f"ipc://{tmp_path}/nobody", f"ipc://{tmp_path}/nobody-replay").start()
    started = time.monotonic()
    log = listener.stop()
    assert time.monotonic() - started < 5
    figures = event_figures(log, changes(log), 10.0, 0.0, 3.0, [])
    assert figures["kv_blocks_stored"] is None and figures["kv_eviction_churn_per_s"] is None
    assert figures["flag"].startswith("no KV event arrived from ipc://")


def test_a_replay_socket_that_never_answers_leaves_the_gap_counted(publisher, tmp_path):
    socket, address = publisher
    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)  # takes requests, answers none
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(f"ipc://{tmp_path}/silent")
    try:
        listener = KvEventSubscriber(address, f"ipc://{tmp_path}/silent").start()
        _send(socket, 0, _batch(BlockStored([1], None, [], 2)))
        _send(socket, 3, _batch(BlockStored([2], None, [], 2)))
        started = time.monotonic()
        log = listener.stop()
        assert time.monotonic() - started < 10
        assert log.lost_batches == 2 and log.replayed_batches == 0
    finally:
        silent.close(0)
        context.term()


def test_an_address_that_cannot_be_listened_on_is_one_clear_error():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match="cannot listen for KV events on tcp://127.0.0.1"):
            KvEventSubscriber(address, bind=True).start()
