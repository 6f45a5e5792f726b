"""The one reader of JSON from outside: nesting measured without recursion before parsing (strings full of
brackets and escapes do not count), refused past the limit as malformed JSON, never a RecursionError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench import json_input

TRICKY_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\ab\n\u00e9'), max_size=12)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=40,
)


def depth(value) -> int:
    if isinstance(value, list):
        return 1 + max((depth(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(item) for item in value.values()), default=0)
    return 0


@given(VALUES, st.integers(min_value=0, max_value=6))
def test_nesting_is_measured_as_the_parsed_value_nests(value, extra):
    text = json.dumps(value, ensure_ascii=False)
    assert json_input._nesting(text) == depth(value)
    wrapped = "[" * extra + text + "]" * extra
    limit = depth(value) + extra
    assert json_input.loads(wrapped, max_depth=limit) == json.loads(wrapped)
    if limit > 0:  # a plain value nests 0 levels: no limit below it
        with pytest.raises(json.JSONDecodeError, match=f"nested deeper than {limit - 1} levels"):
            json_input.loads(wrapped, max_depth=limit - 1)


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_nesting_past_any_recursion_limit_is_malformed_json_not_a_recursion_error(opening):
    text = opening * 200_000 + "1" + ("]" if opening == "[" else "}") * 200_000
    with pytest.raises(json.JSONDecodeError, match="nested deeper than 64 levels"):
        json_input.loads(text)


@given(st.binary(max_size=200))
def test_any_bytes_are_parsed_or_refused_as_malformed_json(data):
    try:
        json_input.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):  # both are ValueError: every caller's "not JSON" path
        pass
