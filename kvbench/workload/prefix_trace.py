"""Request traces with prefix structure: arrivals, lengths and one hash id per block of prompt tokens.

Equal hash ids at the same place in two prompts mean the same tokens, so the KV blocks of the first can serve
the second: the format of Mooncake's public traces (``timestamp`` in ms, ``input_length``, ``output_length``,
``hash_ids`` of 512-token blocks). Two conventions: each row lists every block of its prompt (per-request,
Mooncake's), or each row of a ``session_id`` lists only the blocks its turn adds after the session's previous
prompt (cumulative). Other workloads (token-id requests, shared-prefix groups) become the same structure by
hashing their token blocks; :func:`block_token_ids` turns hash ids back into token ids, the same for every
consumer, so a trace gives the same reuse in a simulation and on a server.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kvbench import json_input
from kvbench.errors import KvbenchError
from kvbench.kv.block_pool import blocks_for
from kvbench.workload.dataset import ASSISTANT_ROLES, HUMAN_ROLES, WORD_PATTERN, shipped_files, shipped_or_path
from kvbench.workload.jsonl import json_objects, read_text

DEFAULT_TRACE_BLOCK = 512  # Mooncake's traces hash prompts in blocks of 512 tokens
CONVENTIONS = ("per-request", "cumulative")
FIRST_TOKEN_ID = 16  # synthesised ids start here: low ids are special tokens in most vocabularies
MAX_TRACE_REQUESTS = 5_000_000
MAX_REQUEST_TOKENS = 10_000_000  # a prompt or an output longer than any model's context is a broken line
MAX_TIMESTAMP_MS = 1e13  # about 300 years: later is a broken line, not a trace
MAX_TIME_SCALE = 1e6


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]  # one per block of ``block_size`` prompt tokens, the last block maybe partial
    session: str | None = None


@dataclass(frozen=True)
class PrefixTrace:
    requests: tuple[TraceRequest, ...]
    block_size: int  # prompt tokens per hash id
    source: str  # where it came from, in words

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0

    def subset(self, max_requests: int | None = None, window_s: tuple[float, float] | None = None) -> PrefixTrace:
        """The requests arriving in ``window_s`` (seconds from the trace's first arrival, end excluded), the
        first ``max_requests`` of them; arrival times then count from the first kept request."""
        requests = list(self.requests)
        if window_s is not None and requests:
            start, end = window_s
            origin = requests[0].arrival_s
            requests = [r for r in requests if start <= r.arrival_s - origin < end]
        if max_requests is not None:
            requests = requests[:max_requests]
        if not requests:
            raise KvbenchError(f"{self.source}: no request is left in the window and count asked for")
        origin = requests[0].arrival_s
        kept = tuple(replace(r, arrival_s=r.arrival_s - origin) for r in requests)
        return replace(self, requests=kept)

    def scaled(self, factor: float) -> PrefixTrace:
        """Arrival times multiplied by ``factor`` (0.5: the same requests twice as fast)."""
        if not (math.isfinite(factor) and 0 < factor <= MAX_TIME_SCALE):
            raise KvbenchError(
                f"a time scale must be a number above 0 and at most {MAX_TIME_SCALE:,.0f}, got {factor!r}"
            )
        return replace(self, requests=tuple(replace(r, arrival_s=r.arrival_s * factor) for r in self.requests))


def builtin_traces() -> dict[str, Path]:
    """Traces shipped with kvbench (``scenarios/traces``, sources and licences in its README), by name."""
    return shipped_files("traces", (".jsonl",))


def resolve_trace(spec: str | Path) -> Path:
    """A shipped trace's name (``mooncake-conversation-1k``) or a path to a file."""
    return shipped_or_path(spec, builtin_traces(), "trace")


def read_prefix_trace(
    path: str | Path, block_size: int = DEFAULT_TRACE_BLOCK, convention: str = "per-request"
) -> PrefixTrace:
    """A hash-id trace from JSONL; every problem is one line naming the file and line."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise KvbenchError(f"a trace's block size must be a positive integer, got {block_size!r}")
    if convention not in CONVENTIONS:
        raise KvbenchError(f"unknown trace convention {convention!r}; choose one of {', '.join(CONVENTIONS)}")
    source = Path(path)
    rows = json_objects(source, read_text(source, "trace file"))
    if not rows:
        raise KvbenchError(f"trace file {source} holds no requests")
    if len(rows) > MAX_TRACE_REQUESTS:
        raise KvbenchError(
            f"trace file {source} holds {len(rows):,} requests, above the limit of {MAX_TRACE_REQUESTS:,}"
        )
    sessions: dict[str, tuple[int, tuple[int, ...]]] = {}  # session -> (prompt tokens, hash ids) of its last turn
    requests: list[TraceRequest] = []
    last_ms = -math.inf
    for where, row in rows:
        missing = [key for key in ("timestamp", "input_length", "output_length", "hash_ids") if key not in row]
        if missing:
            raise KvbenchError(f"{where}: missing field(s) {', '.join(missing)}")
        stamp = row["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not 0 <= stamp <= MAX_TIMESTAMP_MS:
            raise KvbenchError(
                f"{where}: timestamp must be a number of milliseconds from 0 to {MAX_TIMESTAMP_MS:.0e}, got {stamp!r}"
            )
        if stamp < last_ms:
            raise KvbenchError(f"{where}: timestamp {stamp} comes before the previous line's {last_ms:g}")
        last_ms = stamp
        input_len = _count(row["input_length"], where, "input_length", 1)
        output_len = _count(row["output_length"], where, "output_length", 0)
        hash_ids = _hash_ids(row["hash_ids"], where)
        session = row.get("session_id")
        if convention == "cumulative":
            if session is None:
                raise KvbenchError(f"{where}: the cumulative convention needs a session_id on every line")
            prior_len, prior_ids = sessions.get(str(session), (0, ()))
            kept = prior_ids[: prior_len // block_size]  # the previous prompt's full blocks; a partial one grows
            input_len += prior_len
            hash_ids = kept + hash_ids
            if input_len > MAX_REQUEST_TOKENS:
                raise KvbenchError(
                    f"{where}: session {session!s:.40} reaches {input_len:,} prompt tokens, "
                    f"above {MAX_REQUEST_TOKENS:,}"
                )
        expected = blocks_for(input_len, block_size)
        if len(hash_ids) != expected:
            what = "more" if len(hash_ids) > expected else "fewer"
            raise KvbenchError(
                f"{where}: {len(hash_ids)} hash ids for {input_len:,} prompt tokens: {what} than the "
                f"{expected:,} blocks of {block_size} tokens the prompt holds"
            )
        if session is not None:
            sessions[str(session)] = (input_len, hash_ids)
        requests.append(
            TraceRequest(stamp / 1000.0, input_len, output_len, hash_ids, None if session is None else str(session))
        )
    return PrefixTrace(tuple(requests), block_size, str(source))


def _count(value: object, where: str, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_REQUEST_TOKENS:
        raise KvbenchError(f"{where}: {name} must be an integer from {least} to {MAX_REQUEST_TOKENS:,}, got {value!r}")
    return value


def _hash_ids(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise KvbenchError(f"{where}: hash_ids must be a list of integers, got {type(value).__name__}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise KvbenchError(f"{where}: hash_ids must hold non-negative integers, got {item!r}")
    return tuple(value)


def trace_from_prompts(
    prompts: Iterable[tuple[float, Sequence[int], int, str | None]], block_size: int, source: str
) -> PrefixTrace:
    """A trace from ``(arrival_s, prompt token ids, output_len, session)``: each block of tokens gets the id of
    its content and everything before it (a chained hash), so equal ids mean equal prefixes."""
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    requests = []
    for arrival_s, tokens, output_len, session in prompts:
        if not tokens:
            raise KvbenchError(f"{source}: a request has an empty prompt")
        chain, parent = [], -1
        for start in range(0, len(tokens), block_size):
            key = (parent, tuple(tokens[start : start + block_size]))
            parent = ids.setdefault(key, len(ids))
            chain.append(parent)
        requests.append(TraceRequest(float(arrival_s), len(tokens), int(output_len), tuple(chain), session))
    if not requests:
        raise KvbenchError(f"{source}: no requests")
    return PrefixTrace(tuple(sorted(requests, key=lambda r: r.arrival_s)), block_size, source)


Turn = tuple[list[int], list[int]]  # (the user's new token ids, the answer's token ids)


def session_trace(
    sessions: Sequence[Sequence[Turn]], rate: float, think_s: float, seed: int, block_size: int, source: str
) -> PrefixTrace:
    """Multi-turn sessions as a trace: turn k's prompt is every earlier turn's user and answer tokens, then its own
    user tokens (a chat client resends the history). Sessions start as a Poisson process at ``rate`` per second;
    each turn arrives ``think_s`` after the one before."""
    if not (math.isfinite(rate) and rate > 0) or not (math.isfinite(think_s) and think_s >= 0):
        raise KvbenchError("sessions need a positive arrival rate and a think time of 0 s or more")
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1.0 / rate, len(sessions)))
    prompts = []
    for number, (start, turns) in enumerate(zip((starts - starts[0]).tolist(), sessions, strict=True)):
        history: list[int] = []
        for index, (user, answer) in enumerate(turns):
            prompt = history + list(user)
            prompts.append((start + index * think_s, prompt, len(answer), f"session-{number}"))
            history = prompt + list(answer)
    return trace_from_prompts(prompts, block_size, source)


MAX_SYNTHETIC_TOKENS = 50_000_000  # prompt tokens a synthetic workload spells out (about 400 MB of lists)


def shared_prefix_trace(
    groups: int,
    sessions_count: int,
    prefix_len: int,
    suffix_len: int,
    output_len: int,
    rate: float,
    seed: int,
    block_size: int,
    turns: int = 1,
    think_s: float = 0.0,
) -> PrefixTrace:
    """``sessions_count`` sessions spread over ``groups`` in a seeded random order, each a group's shared prefix then
    tokens of its own; with ``turns`` above 1, each later turn adds an answer of ``output_len`` tokens and a user
    message of ``suffix_len`` to the history it resends."""
    for name, value in (("groups", groups), ("sessions", sessions_count), ("prefix length", prefix_len)):
        if value < 1:
            raise KvbenchError(f"{name} must be a positive integer, got {value}")
    if suffix_len < 1 or output_len < 0 or turns < 1:
        raise KvbenchError("a shared-prefix workload needs a suffix of at least one token and one turn or more")
    per_turn = suffix_len + output_len  # each later turn resends the history, which grows by this much
    prompt_tokens = sessions_count * (turns * (prefix_len + suffix_len) + per_turn * turns * (turns - 1) // 2)
    if prompt_tokens > MAX_SYNTHETIC_TOKENS:
        raise KvbenchError(
            f"a shared-prefix workload of {prompt_tokens:,} prompt tokens ({sessions_count:,} sessions x {turns:,} "
            f"turns) is more than kvbench synthesises ({MAX_SYNTHETIC_TOKENS:,}): fewer sessions or turns, or "
            "shorter prefixes; a trace file (hash ids) holds longer workloads"
        )
    rng = np.random.default_rng(seed)
    vocab = 30_000

    def tokens(count: int) -> list[int]:
        return rng.integers(FIRST_TOKEN_ID, vocab, count).tolist()

    prefixes = [tokens(prefix_len) for _ in range(groups)]
    sessions = []
    for slot in rng.permutation(sessions_count).tolist():
        first = prefixes[slot % groups] + tokens(suffix_len)
        sessions.append(
            [(first, tokens(output_len))] + [(tokens(suffix_len), tokens(output_len)) for _ in range(turns - 1)]
        )
    what = f"{groups} shared-prefix groups of {prefix_len} tokens" + (f", {turns} turns each" if turns > 1 else "")
    return session_trace(sessions, rate, think_s, seed, block_size, what)


def sharegpt_sessions(path: Path, limit: int | None = None) -> list[list[Turn]]:
    """The conversations of a ShareGPT file as sessions of (user, answer) turns, words and punctuation as tokens
    (each distinct one an id): equal text gives equal ids, which is all prefix reuse needs. A system message
    opens the first user turn; a user turn without an answer gets an empty one."""
    try:
        data = json_input.loads(read_text(path, "dataset"))
    except json.JSONDecodeError as err:
        raise KvbenchError(f"dataset {path} is not valid JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, list):
        raise KvbenchError(f"dataset {path}: a ShareGPT file is a JSON list of conversations")
    vocabulary: dict[str, int] = {}

    def ids(text: str) -> list[int]:
        return [vocabulary.setdefault(word, FIRST_TOKEN_ID + len(vocabulary)) for word in WORD_PATTERN.findall(text)]

    sessions: list[list[Turn]] = []
    for item in data:
        turns = item.get("conversations", item.get("messages")) if isinstance(item, dict) else None
        if not isinstance(turns, list):
            continue
        session: list[Turn] = []
        pending: list[int] = []
        for turn in turns:
            role = turn.get("from", turn.get("role")) if isinstance(turn, dict) else None
            text = turn.get("value", turn.get("content")) if isinstance(turn, dict) else None
            if not isinstance(role, str) or not isinstance(text, str):
                continue
            role = role.lower()
            if role in HUMAN_ROLES or role == "system":
                pending += ids(text)
            elif role in ASSISTANT_ROLES and pending:
                session.append((pending, ids(text)))
                pending = []
        if pending:
            session.append((pending, []))
        if session:
            sessions.append(session)
        if limit is not None and len(sessions) >= limit:
            break
    if not sessions:
        raise KvbenchError(f"dataset {path} holds no conversation with a user turn")
    return sessions


def token_digits(vocab_size: int) -> int:
    """Leading tokens of a synthesised block that spell its hash id (base ``vocab_size - FIRST_TOKEN_ID``), so
    two ids never give the same block: enough for every id below 2**48."""
    base = vocab_size - FIRST_TOKEN_ID
    if base < 2:
        raise KvbenchError(f"a vocabulary of {vocab_size} token ids leaves none to synthesise prompts from")
    return max(1, math.ceil(48 / math.log2(base)))


def block_token_ids(hash_id: int, block_size: int, vocab_size: int) -> list[int]:
    """The ``block_size`` token ids of block ``hash_id``: its id spelled in the first tokens, the rest seeded by
    the id; a function of the three arguments alone."""
    base = vocab_size - FIRST_TOKEN_ID
    digits = token_digits(vocab_size)
    if block_size < digits:
        raise KvbenchError(f"blocks of {block_size} tokens cannot spell a hash id in a vocabulary of {vocab_size}")
    if hash_id >= 2**48:
        raise KvbenchError(f"hash id {hash_id} is above the 2**48 that synthesised prompts can tell apart")
    spelled, value = [], hash_id
    for _ in range(digits):
        value, digit = divmod(value, base)
        spelled.append(FIRST_TOKEN_ID + digit)
    rest = np.random.default_rng(hash_id).integers(FIRST_TOKEN_ID, vocab_size, block_size - digits)
    return spelled + rest.tolist()


def prompt_token_ids(request: TraceRequest, block_size: int, vocab_size: int) -> list[int]:
    """A trace request's prompt: its blocks' tokens, the last block cut to the prompt's length."""
    tokens: list[int] = []
    for hash_id in request.hash_ids:
        tokens += block_token_ids(hash_id, block_size, vocab_size)
    return tokens[: request.input_len]
