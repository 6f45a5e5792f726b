"""A server's KV events on the wire: the msgpack batches vLLM publishes (and ``kvbench serve`` publishes alike).

Each ZMQ message is three frames: a topic, an 8-byte big-endian sequence number, and a msgpack ``KVEventBatch``:
an array ``[ts, events, data_parallel_rank?]`` whose events are maps tagged by ``type``: ``BlockStored``
(``block_hashes`` in chain order after ``parent_block_hash``, with their ``token_ids`` and ``block_size``),
``BlockRemoved`` (``block_hashes``) and ``AllBlocksCleared``. A hash is an integer or bytes, as the server chose.
Fields kvbench does not read (LoRA, medium, cache-spec details) are accepted and ignored, so a newer server's
batches still decode; anything else (not msgpack, a wrong type, an unknown event) is a :class:`MalformedBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from kvbench.measure.kv_residency import Change

BlockHash = int | bytes
MAX_PAYLOAD_BYTES = 16 * 1024**2  # one batch; a server's step stores a few thousand blocks at most
END_OF_REPLAY = -1  # the sequence number that ends a replay answer
MAX_KEPT_EVENTS = 2_000_000  # events a listening keeps (a few hundred MB at most); the rest are counted


class MalformedBatch(ValueError):
    """A message that is not a KV event batch."""


class BlockStored(msgspec.Struct, tag="BlockStored", tag_field="type"):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None = None
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, tag="BlockRemoved", tag_field="type"):
    block_hashes: list[BlockHash]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True):
    ts: float  # the publisher's clock (Unix seconds)
    events: list[Event]
    data_parallel_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(EventBatch)
_encoder = msgspec.msgpack.Encoder()


def encode_batch(batch: EventBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> EventBatch:
    """One batch from its msgpack payload; :class:`MalformedBatch` with the reason when it is not one."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MalformedBatch(f"a batch of {len(payload):,} bytes (more than {MAX_PAYLOAD_BYTES:,})")
    try:
        batch = _decoder.decode(payload)
    except msgspec.DecodeError as err:  # ValidationError is a DecodeError
        raise MalformedBatch(f"not a KV event batch: {err}") from None
    if batch.ts != batch.ts or batch.ts in (float("inf"), float("-inf")):
        raise MalformedBatch("a batch's time is not a number")
    return batch


def sequence_bytes(seq: int) -> bytes:
    """A sequence number as its frame (8 bytes, big-endian, signed so that the end marker is -1)."""
    return seq.to_bytes(8, "big", signed=True)


def sequence_of(frame: bytes) -> int:
    """A sequence frame's number; :class:`MalformedBatch` when the frame is not 8 bytes."""
    if len(frame) != 8:
        raise MalformedBatch(f"a sequence frame of {len(frame)} bytes (8 expected)")
    return int.from_bytes(frame, "big", signed=True)


def parse_endpoint(text: str, bind: bool) -> str:
    """A ZMQ endpoint as given: ``PORT`` (on 127.0.0.1), ``tcp://HOST:PORT`` or ``ipc://PATH``. ``tcp://*`` is
    refused (it would bind every interface: the address is named), and so is port 0 where a peer must be
    reached (``bind`` False). ValueError with the reason when it is none of these."""
    text = text.strip()
    if text.isdigit():
        text = f"tcp://127.0.0.1:{text}"
    if text.startswith("ipc://") and len(text) > len("ipc://"):
        return text
    if not text.startswith("tcp://"):
        raise ValueError(f"{text!r} is not a port, tcp://HOST:PORT or ipc://PATH")
    host, _, port = text[len("tcp://") :].rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r} is not tcp://HOST:PORT")
    if host == "*":
        raise ValueError(f"{text!r} would listen on every interface: name the address (tcp://127.0.0.1:{port})")
    if not bind and int(port) == 0:
        raise ValueError(f"{text!r}: port 0 names no server")
    return text


@dataclass(frozen=True)
class ReceivedBatch:
    seq: int
    received_s: float  # our clock (Unix seconds) when it arrived; a replayed one's placed by the server's clock
    batch: EventBatch
    replayed: bool = False


@dataclass
class EventLog:
    """What a listening received: the batches in sequence order and what went wrong on the way."""

    endpoint: str
    replay_endpoint: str | None
    started_s: float
    bound: bool = False  # the SUB socket bound the endpoint (the server connects to it)
    stopped_s: float = 0.0
    batches: list[ReceivedBatch] = field(default_factory=list)
    events: int = 0  # events received, kept or not
    dropped_events: int = 0  # past the cap: counted, not kept
    malformed: int = 0
    malformed_reason: str | None = None  # the first one's
    lost_batches: int = 0  # sequence numbers never received nor replayed
    replayed_batches: int = 0
    history_complete: bool = False  # every batch from the server's first (sequence 0) is here
    restarts: int = 0  # the sequence went back to 0: the server (or its publisher) started again
    max_events: int = MAX_KEPT_EVENTS  # kept at most

    @property
    def received_any(self) -> bool:
        return bool(self.batches) or self.malformed > 0


def changes(log: EventLog) -> list[Change]:
    """The log's events in order as residency changes (bytes hashes written as hex)."""
    return changes_of(log.batches)


def changes_of(batches: list[ReceivedBatch]) -> list[Change]:
    out: list[Change] = []
    for received in batches:
        for event in received.batch.events:
            if isinstance(event, BlockStored):
                out.append(Change(received.received_s, "S", tuple(_key(h) for h in event.block_hashes)))
            elif isinstance(event, BlockRemoved):
                out.append(Change(received.received_s, "R", tuple(_key(h) for h in event.block_hashes)))
            else:
                out.append(Change(received.received_s, "C"))
    return out


def _key(block_hash: int | bytes) -> int | str:
    return block_hash.hex() if isinstance(block_hash, bytes) else block_hash
