"""Fuzzed event streams: whatever bytes a server sends, however the network splits them, the client reads the
same events or stops at a :class:`MalformedStream`, never a traceback; and whatever one event says, it is an
:class:`Event` with counts that are counts, or a MalformedStream.

Streams are built from the pieces that matter to the decoder (``data:`` with and without its space, other
fields, comments, LF, CRLF and lone CR, ``[DONE]``, invalid and split UTF-8) and from arbitrary bytes, and are
decoded whole, one byte at a time and at fuzzed cuts. The one documented exception to split invariance, the
:data:`MAX_EVENT_BYTES` cap on an event still waiting for its end, has its own test.
"""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvbench.endpoint.openai import DONE, Event, parse_event
from kvbench.endpoint.sse import MAX_EVENT_BYTES, MalformedStream, SSEDecoder

PIECES = st.sampled_from(
    [
        b"data:",
        b"data: ",
        b"data",
        b"event: message",
        b"id: 7",
        b"retry: 10",
        b": ping",
        b":",
        b"\n",
        b"\r\n",
        b"\r",
        b"\n\n",
        b"\r\r",
        b"[DONE]",
        b'{"choices": [{"text": "x"}]}',
        b"\xc3\xa9",  # UTF-8 of one character, which a cut may split
        b"\xc3",  # half of it
        b"\xff",  # never UTF-8
        b" ",
        b"x",
    ]
)
STREAMS = st.lists(PIECES | st.binary(max_size=12), max_size=40).map(b"".join)


def decode(chunks: list[bytes]) -> tuple[list[str], bool]:
    """(the data of every event, whether the stream was found malformed); only MalformedStream may be raised."""
    decoder = SSEDecoder()
    out: list[str] = []
    try:
        for chunk in chunks:
            out += decoder.feed(chunk)
        out += decoder.close()
    except MalformedStream:
        return out, True
    assert all(isinstance(data, str) for data in out)
    return out, False


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (positions taken modulo its length + 1; a repeated one makes an empty chunk)."""
    points = sorted(cut % (len(data) + 1) for cut in cuts)
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# A chunk that ends in CR, then an empty chunk, then one that starts with LF: the empty chunk dropped the pending
# CR, so the CRLF was read as two line ends and one event split in two.
@settings(max_examples=300)
@given(data=STREAMS, cuts=st.lists(st.integers(0, 2**16), max_size=8))
@example(data=b"data: x\r\ndata: y\n\n", cuts=[8, 8])
def test_any_bytes_give_the_same_events_however_they_are_split(data, cuts):
    whole, malformed = decode([data])
    chunked, chunked_malformed = decode(split(data, cuts))
    bytewise, bytewise_malformed = decode([bytes([b]) for b in data])
    assert chunked_malformed == malformed == bytewise_malformed
    if malformed:  # the events before the bad one may be handed out first (bytewise: all of them), never others
        assert whole == bytewise[: len(whole)] and chunked == bytewise[: len(chunked)]
    else:
        assert chunked == whole == bytewise


# The cap was checked only when a chunk completed no event: the same chunk ending an earlier event and bringing
# more than the cap of an unfinished one was read without a MalformedStream, and close() dropped it quietly.
@settings(max_examples=20, deadline=None)
@given(
    before=STREAMS.map(lambda b: b + b"\n\n"),
    line=st.sampled_from([b"data: ", b"data:", b": "]),
    cuts=st.lists(st.integers(0, MAX_EVENT_BYTES + 64), max_size=4),
)
@example(before=b"\n\n", line=b"data: ", cuts=[])
def test_an_event_past_the_cap_without_an_end_is_malformed_however_it_arrives(before, line, cuts):
    data = before + line + b"x" * (MAX_EVENT_BYTES + 1)  # no blank line ever comes
    for chunks in ([data], split(data, cuts)):
        assert decode(chunks)[1]


# -- one event's data ---------------------------------------------------------------------------------------
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.builds(lambda sign, power: sign * 10**power, st.sampled_from([1, -1]), st.sampled_from([9, 19, 30, 4000]))
    | st.floats()
    | st.text(max_size=8)
)
ANY_JSON = st.recursive(
    JSON_SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
)
COUNT = st.integers(-2, 10**6) | JSON_SCALARS | ANY_JSON


def nested(value, depth: int):
    for _ in range(depth):
        value = [value]
    return value


CHOICE = st.fixed_dictionaries(
    {},
    optional={
        "text": st.text(max_size=4) | ANY_JSON,
        "delta": st.fixed_dictionaries(
            {},
            optional={
                "content": st.text(max_size=4) | ANY_JSON,
                "role": st.just("assistant") | ANY_JSON,
                "reasoning_content": st.text(max_size=4) | ANY_JSON,
                "reasoning": ANY_JSON,
            },
        )
        | ANY_JSON,
        "finish_reason": st.sampled_from(["stop", "length", None, ""]) | ANY_JSON,
        "token_ids": st.lists(st.integers(), max_size=3) | ANY_JSON,
    },
)
USAGE = st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": COUNT,
        "completion_tokens": COUNT,
        "total_tokens": COUNT,
        "prompt_tokens_details": st.fixed_dictionaries({}, optional={"cached_tokens": COUNT}) | ANY_JSON,
    },
)
ERROR = st.fixed_dictionaries({}, optional={"message": ANY_JSON, "msg": ANY_JSON}) | ANY_JSON
CHUNKS = st.one_of(
    st.fixed_dictionaries({"choices": st.lists(CHOICE, min_size=1, max_size=2)}, optional={"usage": USAGE}),
    st.fixed_dictionaries({"choices": st.just([]) | ANY_JSON, "usage": USAGE}),
    st.fixed_dictionaries({"error": ERROR}, optional={"choices": st.lists(CHOICE, max_size=1)}),
    st.fixed_dictionaries(
        {}, optional={"choices": st.lists(CHOICE | ANY_JSON, max_size=2) | ANY_JSON, "usage": USAGE | ANY_JSON}
    ),
)
EVENT_DATA = st.one_of(
    CHUNKS.map(json.dumps),  # NaN and Infinity as Python's json writes them (and reads them)
    ANY_JSON.map(json.dumps),
    st.tuples(CHUNKS, st.integers(0, 80)).map(lambda t: json.dumps({**t[0], "usage": nested(t[0], t[1])})),
    st.tuples(ANY_JSON, st.integers(0, 80)).map(lambda t: json.dumps({"error": nested(t[0], t[1])})),
    st.text(max_size=30),
    st.sampled_from(["[DONE]", "[DONE] ", "", "{", "null", "{}", '{"choices": []}']),
)


def check_count(value) -> None:
    assert value is None or (type(value) is int and value >= 0), value


@settings(max_examples=300)
@given(data=EVENT_DATA)
@example(data='{"usage": {"prompt_tokens": ' + "1" * 5000 + "}}")
@example(
    data='{"usage": {"prompt_tokens": true, "completion_tokens": -1, "prompt_tokens_details": {"cached_tokens": 1.5}}}'
)
@example(data='{"error": ' + "[" * 70 + "]" * 70 + "}")
def test_any_event_data_is_an_event_or_malformed_and_its_counts_are_counts(data):
    try:
        event = parse_event(data)
    except MalformedStream:
        return
    assert isinstance(event, Event)
    if event is DONE:
        return
    assert event.text is None or isinstance(event.text, str)
    assert event.finish_reason is None or isinstance(event.finish_reason, str)
    assert event.error is None or isinstance(event.error, str)
    for count in (event.prompt_tokens, event.completion_tokens, event.cached_tokens):
        check_count(count)
