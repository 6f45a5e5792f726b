"""The messages between ``kvbench serve``'s front end and its engine process: one class per kind, tagged by its
``"t"`` in the JSON of a frame, and the codec of each direction (``serve/channel.py`` carries the frames).

Both ends read attributes; a frame that is no message of the other side's is refused as it is decoded. Internal to
the server (both processes run the same kvbench), so nothing here reads an older version's messages.
"""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.serve.engine_stats import EngineStats
from kvbench.serve.settings import ServeOptions
from kvbench.values import ThreadChoice


# -- the front end's commands to the engine ------------------------------------------------------------------
class StartEngine(msgspec.Struct, tag="start", tag_field="t"):
    """The first message: load the model and build the engine these settings ask for."""

    options: ServeOptions
    metrics: bool = True  # time each block allocation (for the /metrics latency histogram)


class SubmitJob(msgspec.Struct, tag="submit", tag_field="t"):
    """One HTTP request's generation: each prompt ``n`` times."""

    job: int
    prompts: list[list[int]]  # token ids
    params: list[SamplingParams]  # one per prompt
    n: int  # choices per prompt
    fork: bool  # the samples of a prompt forked from one request (sharing its prompt blocks)
    wake: bool  # every token sent as sampled; else a choice's tokens come with its end


class AbortJob(msgspec.Struct, tag="abort", tag_field="t"):
    """Withdraw a job's requests (their KV blocks back in the pool before the next step)."""

    job: int
    choices: list[int] | None  # None: all of them


class StopEngine(msgspec.Struct, tag="stop", tag_field="t"):
    """Stop once the work left is done."""


class ResetPrefixCache(msgspec.Struct, tag="reset", tag_field="t"):
    """Empty the prefix cache between steps; answered by a ``ResetDone`` of the same id."""

    id: int


Command = StartEngine | SubmitJob | AbortJob | StopEngine | ResetPrefixCache


# -- the engine's messages to the front end ------------------------------------------------------------------
class ChoiceEnd(msgspec.Struct, array_like=True):
    """A choice that ended this step (a JSON array in its frame)."""

    job: int
    choice: int
    tokens: list[int]  # its last token, or all of its tokens when its job is not woken per token
    finish: str  # OpenAI's finish reason
    stop: int | None  # the stop token that ended it
    cached: int | None  # prompt tokens its first admission found in the prefix cache (None: not admitted yet)


class JobFailure(msgspec.Struct, array_like=True):
    """A job the engine refused (a JSON array in its frame)."""

    job: int
    status: int  # the HTTP status its request fails with
    message: str


class EngineReport(msgspec.Struct, tag_field="t", kw_only=True, omit_defaults=True):
    """What a message of the engine loop carries besides its own parts: the engine's counts (at most every few
    milliseconds while stepping), the tokens and ends since the last message, and the jobs refused. These keys
    follow a kind's own ones in its frame (keyword-only fields come last), each left out while empty."""

    stats: EngineStats | None = None
    out: list[int] = []  # this step's tokens, flat: job, choice, token, job, choice, token, ...
    end: list[ChoiceEnd] = []
    fail: list[JobFailure] = []


class StepReport(EngineReport, tag="step"):
    """A step's news."""


class IdleReport(EngineReport, tag="idle"):
    """The engine has no work left after taking ``seq`` messages; the KV manager's drained check with it."""

    seq: int
    leak: str | None  # what the drained check found leaked


class StoppedReport(EngineReport, tag="stopped"):
    """The engine stopped as told, its work done; the drained check with it."""

    leak: str | None


class ResetDone(EngineReport, tag="reset"):
    """The answer to a ``ResetPrefixCache``: whether the prefix cache was emptied."""

    id: int
    ok: bool


class EngineFacts(msgspec.Struct):
    """What the front end needs of the engine it serves, once loaded (the tokenizer it loads itself)."""

    name: str  # the served model name
    max_len: int
    vocab_size: int
    parallel_sampling: bool
    engine: str
    device_name: str
    budget_source: str
    threads: ThreadChoice | None  # the CPU threads chosen and why (None: not a CPU engine)
    heap: str | None  # the CPU heap policy, described (None: not a CPU engine)
    num_blocks: int
    block_size: int
    reserve: str
    admission: str
    pid: int
    kv_events: str | None  # the ZMQ address its KV events are published on
    kv_events_replay: str | None


class Ready(EngineReport, tag="ready"):
    """The engine is loaded and waits for jobs."""

    info: EngineFacts


class LoadStatus(msgspec.Struct, tag="status", tag_field="t"):
    """Progress while loading, for the front end's status line."""

    text: str


class LoadFailed(msgspec.Struct, tag="error", tag_field="t"):
    """The settings were refused (exit code 2) or loading failed (1); the engine process ends with that code."""

    message: str
    exit_code: int


class Crashed(msgspec.Struct, tag="crash", tag_field="t"):
    """A step failed: the reason in one line; the engine process ends."""

    error: str


LoopReport = StepReport | IdleReport | StoppedReport | ResetDone  # what the engine loop sends with its news
Report = StepReport | IdleReport | StoppedReport | ResetDone | Ready | LoadStatus | LoadFailed | Crashed


# -- the codecs ----------------------------------------------------------------------------------------------
class _Kind(msgspec.Struct):
    """Only a frame's kind: to say which one the engine does not know."""

    t: Any = None


_ENCODER = msgspec.json.Encoder()
_COMMAND_DECODER = msgspec.json.Decoder(Command)
_REPORT_DECODER = msgspec.json.Decoder(Report)
_KIND_DECODER = msgspec.json.Decoder(_Kind)
_COMMAND_KINDS = frozenset(cls.__struct_config__.tag for cls in get_args(Command))


def encode(message: Command | Report) -> bytes:
    return _ENCODER.encode(message)


def decode_command(frame: bytes) -> Command:
    """The front end's message in ``frame``; one the engine cannot understand raises ``KvbenchError`` (broken JSON
    raises ``msgspec.DecodeError``)."""
    try:
        return _COMMAND_DECODER.decode(frame)
    except msgspec.ValidationError as err:
        kind = _KIND_DECODER.decode(frame).t
        if not isinstance(kind, str) or kind not in _COMMAND_KINDS:
            raise KvbenchError(f"the front end sent a message of unknown kind {kind!r}") from None
        raise KvbenchError(f"the front end sent a {kind!r} message the engine cannot read: {err}") from None


def decode_report(frame: bytes) -> Report:
    """The engine's message in ``frame`` (``msgspec.DecodeError`` if it is none)."""
    return _REPORT_DECODER.decode(frame)
