"""The KV event wire format: vLLM's own bytes decode, ours encode to the same bytes, anything else is refused."""

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench.measure.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    MalformedBatch,
    decode_batch,
    encode_batch,
    parse_endpoint,
    sequence_bytes,
    sequence_of,
)

# A batch as vLLM 0.32's ZmqEventPublisher encodes it (msgspec over its KVEventBatch), captured from vLLM itself:
# a store of two integer hashes, a removal of a bytes hash, and a clear, from data-parallel rank 0.
VLLM_BATCH = (
    b"\x93\xcb?\xf8\x00\x00\x00\x00\x00\x00\x93\x88\xa4type\xabBlockStored\xacblock_hashes\x92\x01\x02"
    b"\xb1parent_block_hash\xc0\xa9token_ids\x94\x05\x06\x07\x08\xaablock_size\x02\xa7lora_id\xc0\xa6medium"
    b"\xa3GPU\xa9lora_name\xc0\x83\xa4type\xacBlockRemoved\xacblock_hashes\x91\xc4\x02ab\xa6medium\xa3GPU\x81"
    b"\xa4type\xb0AllBlocksCleared\x00"
)


def test_vllms_batch_decodes_and_ours_encodes_to_the_same_bytes():
    batch = decode_batch(VLLM_BATCH)
    assert batch.ts == 1.5 and batch.data_parallel_rank == 0
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == [1, 2] and stored.token_ids == [5, 6, 7, 8]
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [b"ab"]
    assert isinstance(cleared, AllBlocksCleared)
    assert encode_batch(batch) == VLLM_BATCH


def test_fields_a_newer_server_adds_are_ignored():
    event = {"type": "BlockRemoved", "block_hashes": [3], "medium": "GPU", "group_idx": 0, "locality": "LOCAL"}
    batch = decode_batch(msgspec.msgpack.encode([2.0, [event]]))
    assert batch.events == [BlockRemoved([3], "GPU")] and batch.data_parallel_rank is None


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used in msgpack
        msgspec.msgpack.encode({"ts": 1.0}),
        msgspec.msgpack.encode([None, []]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockEvicted", "block_hashes": [1]}]]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": "1"}]]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]]),
        msgspec.msgpack.encode([float("nan"), []]),
        msgspec.msgpack.encode([1.0, [], 0])[:-1],  # cut short
    ],
)
def test_what_is_not_a_batch_is_refused_with_a_reason(payload):
    with pytest.raises(MalformedBatch):
        decode_batch(payload)


@given(st.binary(max_size=64))
def test_no_bytes_crash_the_decoder(payload):
    try:
        decode_batch(payload)
    except MalformedBatch:
        pass


def test_sequence_frames():
    assert sequence_of(sequence_bytes(41)) == 41 and sequence_of(sequence_bytes(-1)) == -1
    with pytest.raises(MalformedBatch):
        sequence_of(b"\x00" * 7)


@pytest.mark.parametrize(
    "text, bind, expected",
    [
        ("5557", True, "tcp://127.0.0.1:5557"),
        ("tcp://127.0.0.1:0", True, "tcp://127.0.0.1:0"),
        ("tcp://[::1]:5557", False, "tcp://[::1]:5557"),
        ("ipc:///tmp/kv", False, "ipc:///tmp/kv"),
    ],
)
def test_endpoints_as_given(text, bind, expected):
    assert parse_endpoint(text, bind) == expected


@pytest.mark.parametrize(
    "text, bind, reason",
    [
        ("tcp://*:5557", True, "every interface"),
        ("tcp://127.0.0.1:0", False, "port 0"),
        ("udp://127.0.0.1:1", False, "not a port"),
        ("tcp://127.0.0.1:99999", False, "not tcp"),
        ("tcp://:5557", True, "not tcp"),
        ("ipc://", False, "not a port"),
    ],
)
def test_endpoints_refused(text, bind, reason):
    with pytest.raises(ValueError, match=reason):
        parse_endpoint(text, bind)


def test_an_event_batch_round_trips():
    batch = EventBatch(3.0, [BlockStored([2**63 - 1, -(2**63)], None, [1] * 4, 2), AllBlocksCleared()])
    assert decode_batch(encode_batch(batch)) == batch
