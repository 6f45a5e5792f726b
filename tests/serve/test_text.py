"""Incremental decoding and stop strings, on a real byte-level BPE tokenizer (the tiny GGUF's, made by the tests).

The oracle is the tokenizer itself: the pieces a stream hands out, joined, must be the text of the whole answer,
however the tokens arrive (one by one or in bursts), and no piece may end inside a character.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.serve.text import TextStream


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    from kvbench.models.tokenizers import load_tokenizer

    return load_tokenizer(str(tiny_gguf[0]))


def _feed(stream: TextStream, ids: list[int], sizes: list[int]) -> tuple[list[str], int]:
    pieces, counted, at = [], 0, 0
    for size in [*sizes, len(ids)]:
        burst = ids[at : at + max(size, 1)]
        if not burst:
            break
        at += len(burst)
        counted += stream.add(burst, final=at >= len(ids))
        pieces.append(stream.take(done=False))
        if stream.stopped is not None:
            break
    stream.finish()
    pieces.append(stream.take(done=True))
    return pieces, counted


TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(prompt=TEXT, answer=TEXT, sizes=st.lists(st.integers(1, 5), max_size=20))
def test_pieces_join_to_the_answer_whatever_the_bursts(tokenizer, prompt, answer, sizes):
    ids = tokenizer(answer)["input_ids"]
    stream = TextStream(tokenizer, tokenizer(prompt)["input_ids"])
    pieces, counted = _feed(stream, ids, sizes)
    assert "".join(pieces) == answer == stream.text
    assert counted == len(ids)


def test_a_character_spread_over_tokens_is_never_split(tokenizer):
    ids = tokenizer("é€😀 ok")["input_ids"]
    assert len(ids) > 4  # byte tokens: the characters span several
    stream = TextStream(tokenizer, [35])
    pieces, _ = _feed(stream, ids, [1] * len(ids))
    assert "".join(pieces) == "é€😀 ok" and not any("\ufffd" in piece for piece in pieces)


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_cuts_the_text_and_counts_the_token_that_completed_it(tokenizer, include):
    answer = "one two the three the four"
    ids = tokenizer(answer)["input_ids"]
    stream = TextStream(tokenizer, [35], stop_strings=("three", "zzz"), include_stop=include)
    pieces, counted = _feed(stream, ids, [1] * len(ids))
    expected = "one two the three" if include else "one two the "
    assert stream.stopped == "three" and stream.text == expected and "".join(pieces) == expected
    # the counted tokens are the fewest whose text holds the stop string
    assert "three" in tokenizer.decode(ids[:counted]) and "three" not in tokenizer.decode(ids[: counted - 1])


def test_streaming_holds_back_what_could_begin_a_stop_string(tokenizer):
    ids = tokenizer("abcdef")["input_ids"]
    stream = TextStream(tokenizer, [35], stop_strings=("defx",))
    shown = []
    for token in ids:
        stream.add([token])
        shown.append(stream.take(done=False))
    assert "".join(shown) == "abc"  # "def" might still become "defx"
    stream.finish()
    assert stream.take(done=True) == "def" and stream.stopped is None


def test_the_earliest_of_several_stop_strings_wins(tokenizer):
    ids = tokenizer("xx b a yy")["input_ids"]
    stream = TextStream(tokenizer, [35], stop_strings=("a", "b"))
    stream.add(ids, final=True)
    assert stream.stopped == "b" and stream.text == "xx "


def test_without_a_tokenizer_every_token_counts_and_there_is_no_text():
    stream = TextStream(None, [1, 2])
    assert stream.add([5, 6, 7]) == 3 and stream.take(done=True) == ""
