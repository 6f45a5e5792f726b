"""The typed messages between the server's front end and its engine process: each kind survives its frame, the
frames are the JSON the channel has always carried, and a frame that is no message is refused."""

from __future__ import annotations

import msgspec
import pytest

from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.serve.channel import ChannelError, FrameBuffer, frame
from kvbench.serve.engine_messages import (
    AbortJob,
    ChoiceEnd,
    Crashed,
    EngineFacts,
    IdleReport,
    JobFailure,
    LoadFailed,
    LoadStatus,
    Ready,
    ResetDone,
    ResetPrefixCache,
    StartEngine,
    StepReport,
    StopEngine,
    StoppedReport,
    SubmitJob,
    decode_command,
    decode_report,
    encode,
)
from kvbench.serve.engine_stats import EngineStats
from kvbench.serve.settings import ServeOptions
from kvbench.values import ThreadChoice

STATS = EngineStats(used=3, free=5, capacity=8, block_size=16, fragmentation=0.25, tokens=40, alloc=[0.5, 2e-06])
FACTS = EngineFacts(
    name="tiny",
    max_len=2048,
    vocab_size=256,
    parallel_sampling=True,
    engine="paged",
    device_name="cpu",
    budget_source="--kv-memory 1MiB",
    threads=ThreadChoice(1, "set by the user"),
    heap=None,
    num_blocks=9,
    block_size=16,
    reserve="max",
    admission="queue",
    pid=42,
    kv_events=None,
    kv_events_replay=None,
)
COMMANDS = [
    StartEngine(ServeOptions(model="tiny", utilization=0.5, served_model_name="ünï"), metrics=False),
    SubmitJob(3, [[1, 2], [3]], [SamplingParams(temperature=0.5, seed=7, stop_token_ids=(4, 5))] * 2, 2, True, False),
    AbortJob(3, None),
    AbortJob(3, [0, 2]),
    StopEngine(),
    ResetPrefixCache(12),
]
REPORTS = [
    StepReport(),
    StepReport(
        stats=STATS,
        out=[3, 0, 9, 3, 1, 10],
        end=[ChoiceEnd(3, 2, [11], "stop", 11, 16), ChoiceEnd(4, 0, [1, 2], "length", None, None)],
        fail=[JobFailure(5, 503, "the KV cache cannot hold this request now")],
    ),
    IdleReport(seq=6, leak=None, stats=STATS),
    StoppedReport(leak="2 blocks still held", stats=STATS, out=[1, 0, 2]),
    ResetDone(id=12, ok=False),
    Ready(info=FACTS, stats=EngineStats()),
    LoadStatus("loading the model…"),
    LoadFailed("--kv-memory is too small", 2),
    Crashed("RuntimeError: boom (at engine_core.py:1 in run)"),
]


@pytest.mark.parametrize("message", COMMANDS, ids=lambda m: type(m).__name__)
def test_a_command_survives_its_frame(message):
    decoded = decode_command(encode(message))
    assert type(decoded) is type(message) and decoded == message


@pytest.mark.parametrize("message", REPORTS, ids=lambda m: type(m).__name__)
def test_a_report_survives_its_frame(message):
    decoded = decode_report(encode(message))
    assert type(decoded) is type(message) and decoded == message


def test_the_frames_are_the_json_the_channel_carried_as_dicts():
    """Keys in the order the dicts had them, news left out while empty, a leak of None written as null, ends and
    failures as arrays, a sampling parameter's tuple as a list."""
    params = SamplingParams(seed=1, stop_token_ids=(4,))
    assert encode(SubmitJob(0, [[1, 2]], [params], 1, False, True)) == (
        b'{"t":"submit","job":0,"prompts":[[1,2]],"params":[{"temperature":0.0,"top_k":0,"top_p":1.0,"seed":1,'
        b'"max_tokens":16,"ignore_eos":false,"eos_token_id":null,"stop_token_ids":[4]}],"n":1,"fork":false,'
        b'"wake":true}'
    )
    assert encode(AbortJob(0, None)) == b'{"t":"abort","job":0,"choices":null}'
    assert encode(StepReport(out=[0, 0, 5])) == b'{"t":"step","out":[0,0,5]}'
    assert encode(StepReport(end=[ChoiceEnd(0, 1, [6], "stop", 6, None)], fail=[JobFailure(1, 400, "no")])) == (
        b'{"t":"step","end":[[0,1,[6],"stop",6,null]],"fail":[[1,400,"no"]]}'
    )
    idle = encode(IdleReport(seq=4, leak=None, stats=EngineStats(), out=[1, 0, 2]))
    assert idle.startswith(b'{"t":"idle","seq":4,"leak":null,"stats":{"used":0,"free":0,"capacity":0,')
    assert idle.endswith(
        b'"cached_blocks":0,"alloc":[],"steps":{"decode_steps":0,"decode_seconds":0.0,"decode_tokens":0,'
        b'"prefill_steps":0,"prefill_seconds":0.0,"prefill_tokens":0}},"out":[1,0,2]}'
    )
    assert encode(ResetDone(id=3, ok=True)) == b'{"t":"reset","id":3,"ok":true}'
    assert encode(LoadFailed("bad", 2)) == b'{"t":"error","message":"bad","exit_code":2}'
    assert encode(LoadStatus("ünï")) == '{"t":"status","text":"ünï"}'.encode()  # UTF-8, not escaped


def test_the_thread_choice_travels_as_the_dict_it_was():
    """The engine's typed thread choice is the ``{"threads", "reason"}`` object on the wire, and reads back typed."""
    frame_bytes = encode(Ready(info=FACTS))
    assert b'"threads":{"threads":1,"reason":"set by the user"}' in frame_bytes
    decoded = decode_report(frame_bytes)
    assert isinstance(decoded, Ready) and decoded.info.threads == ThreadChoice(1, "set by the user")
    assert decode_report(encode(Ready(info=msgspec.structs.replace(FACTS, threads=None)))) == Ready(
        info=msgspec.structs.replace(FACTS, threads=None)
    )


def test_a_frame_the_engine_does_not_understand_is_refused_with_its_kind():
    with pytest.raises(KvbenchError, match="unknown kind 'bogus'"):
        decode_command(b'{"t":"bogus"}')
    with pytest.raises(KvbenchError, match="unknown kind None"):
        decode_command(b'{"job":1}')
    with pytest.raises(KvbenchError, match="unknown kind 'idle'"):  # the engine's own kind, not a command
        decode_command(encode(IdleReport(seq=1, leak=None)))
    with pytest.raises(KvbenchError, match="'submit' message the engine cannot read: .*`job`"):
        decode_command(b'{"t":"submit","prompts":[]}')
    with pytest.raises(KvbenchError, match="temperature must be >= 0"):  # SamplingParams checks what it gets
        decode_command(
            b'{"t":"submit","job":0,"prompts":[[1]],"params":[{"temperature":-1}],"n":1,"fork":false,"wake":true}'
        )


def test_the_front_end_refuses_a_frame_that_is_no_report():
    with pytest.raises(msgspec.DecodeError):
        decode_report(encode(StopEngine()))
    buffer = FrameBuffer(decode_report)
    with pytest.raises(ChannelError, match="not a message"):
        buffer.feed(frame(SubmitJob(0, [[1]], [SamplingParams()], 1, False, True)))


def test_a_frame_buffer_decodes_frames_that_arrive_in_pieces():
    data = b"".join(frame(message) for message in REPORTS)
    buffer = FrameBuffer(decode_report)
    received = []
    for at in range(0, len(data), 7):
        received += buffer.feed(data[at : at + 7])
    assert received == REPORTS
