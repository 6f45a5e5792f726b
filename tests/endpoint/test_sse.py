"""Decoding event streams: recorded vLLM streams, split anywhere, and what the standard says about the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.endpoint.sse import MAX_EVENT_BYTES, MalformedStream, SSEDecoder

DATA = Path(__file__).parent / "data"


def decode(chunks: list[bytes]) -> list[str]:
    decoder = SSEDecoder()
    out = [data for chunk in chunks for data in decoder.feed(chunk)]
    return out + decoder.close()


@pytest.mark.parametrize("name", ["vllm_completions.sse", "vllm_chat.sse"])
def test_a_recorded_stream_gives_the_same_events_however_it_is_split(name):
    raw = (DATA / name).read_bytes()
    whole = decode([raw])
    assert whole[-1] == "[DONE]" and all(d.startswith("{") for d in whole[:-1])
    assert len(whole) == raw.count(b"data: ")
    for cut in range(1, len(raw)):
        assert decode([raw[:cut], raw[cut:]]) == whole
    assert decode([bytes([b]) for b in raw]) == whole  # one byte at a time


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_and_a_cr_lf_split_across_chunks(ending):
    text = ending.join([b"data: a", b"", b"data: b", b"", b""])
    assert decode([text]) == ["a", "b"]
    for cut in range(1, len(text)):
        assert decode([text[:cut], text[cut:]]) == ["a", "b"]


def test_fields_comments_multiline_data_and_events_without_data():
    stream = (
        b": ping\n\n"  # a comment alone: no event
        b"event: message\nid: 7\ndata: first\ndata:second\n\n"  # two data lines, the space is optional
        b"retry: 100\n\n"  # no data: no event
        b"data\n\n"  # a bare field name: empty data
        b"data: \xc3\xa9t\xc3\xa9\n\n"
    )  # UTF-8, split anywhere below
    assert decode([stream]) == ["first\nsecond", "", "été"]
    for cut in range(1, len(stream)):
        assert decode([stream[:cut], stream[cut:]]) == ["first\nsecond", "", "été"]


def test_the_end_of_a_stream():
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a": 1}\n\ndata: [DONE]') == ['{"a": 1}']
    assert decoder.pending
    assert decoder.close() == ["[DONE]"]  # some servers omit the last blank line
    cut = SSEDecoder()
    assert cut.feed(b'data: {"choices": [{"te') == []
    assert cut.close() == []  # an unfinished event is discarded; the caller sees no [DONE]


def test_malformed_streams_are_refused():
    with pytest.raises(MalformedStream, match="not UTF-8"):
        SSEDecoder().feed(b"data: \xff\xfe\n\n")
    decoder = SSEDecoder()
    with pytest.raises(MalformedStream, match="without an end"):
        for _ in range(MAX_EVENT_BYTES // 65536 + 2):
            decoder.feed(b"x" * 65536)
