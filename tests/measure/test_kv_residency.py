"""Resident blocks, lifetimes, churn and thrash rebuilt from KV events, against hand-counted sequences."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbench.measure.kv_residency import (
    Change,
    changes_from_rows,
    kv_events_text,
    read_kv_events_text,
    rebuild,
)


def test_lifetimes_churn_and_thrash_by_hand():
    changes = [
        Change(0.0, "S", (1, 2, 3)),
        Change(1.0, "R", (1,)),  # lived 1 s
        Change(2.0, "S", (1,)),  # back 1 s after its removal: thrash within 5 s
        Change(4.0, "R", (2, 3)),  # lived 4 s each
        Change(20.0, "S", (2,)),  # back 16 s later: not thrash
        Change(21.0, "R", (9,)),  # never seen stored
    ]
    result = rebuild(changes, window_s=5.0, complete=True, span_s=21.0)
    assert (result.stored, result.removed, result.removed_unknown) == (5, 3, 1)
    assert sorted(result.lifetimes_s) == [1.0, 4.0, 4.0]
    assert (result.stored_again, result.thrashed, result.thrash_share) == (2, 1, pytest.approx(1 / 3))
    assert sorted(result.restore_gaps_s) == [1.0, 16.0]
    assert result.churn_per_s == pytest.approx(3 / 21)
    assert (result.resident_end, result.resident_peak) == (2, 3)
    assert [result.resident_at(t) for t in (-1.0, 0.0, 1.5, 3.0, 5.0, 30.0)] == [0, 3, 2, 3, 1, 2]


def test_a_clear_empties_the_set_and_what_follows_is_not_thrash():
    changes = [Change(0.0, "S", (1, 2)), Change(1.0, "C"), Change(1.5, "S", (1,))]
    result = rebuild(changes, window_s=10.0, complete=True)
    assert result.cleared == 1 and result.resident_end == 1 and result.thrashed == 0 and result.removed == 0


def test_changes_before_the_load_build_the_set_but_are_not_counted():
    changes = [Change(0.0, "S", (1, 2)), Change(5.0, "R", (1,)), Change(6.0, "S", (1,))]
    result = rebuild(changes, window_s=10.0, complete=True, count_from_s=4.0)
    assert (result.stored, result.removed, result.thrashed, result.removed_unknown) == (1, 1, 1, 0)
    assert result.lifetimes_s == [5.0]


@given(
    st.lists(
        st.tuples(st.sampled_from("SRC"), st.lists(st.integers(0, 6), max_size=4, unique=True)),
        max_size=40,
    )
)
def test_the_resident_count_is_what_a_plain_set_holds(steps):
    changes, model, removed_known = [], set(), 0
    for at, (kind, keys) in enumerate(steps):
        changes.append(Change(float(at), kind, tuple(keys) if kind != "C" else ()))
        if kind == "S":
            model |= set(keys)
        elif kind == "R":
            removed_known += len(model & set(keys))
            model -= set(keys)
        else:
            model.clear()
    result = rebuild(changes, window_s=3.0, complete=True)
    assert result.resident_end == len(model) and result.removed == removed_known
    assert (result.series[-1][1] if result.series else 0) == len(model)
    assert 0 <= result.thrashed <= result.stored_again


def test_the_file_form_round_trips_and_refuses_what_is_not_one():
    changes = [Change(1.0, "S", (1, "ab")), Change(2.0, "R", (1,)), Change(2.0, "C")]
    figures, back = read_kv_events_text(kv_events_text({"batches": 2}, changes))
    assert figures == {"batches": 2} and back == changes
    for text, reason in (
        ("", "empty"),
        ('{"kind": "other", "figures": {}}\n', "does not name"),
        ('{"kind": "kvbench.kv_events", "figures": {}}\n[1.0, "X", []]\n', "none of S, R, C"),
        ('{"kind": "kvbench.kv_events", "figures": {}}\n[2.0, "S", []]\n[1.0, "S", []]\n', "at or after"),
        ('{"kind": "kvbench.kv_events", "figures": {}}\n[1.0, "S", [true]]\n', "neither an integer"),
        ('{"kind": "kvbench.kv_events", "figures": {}}\n{"a": 1}\n', "not \\[time"),
        ("not json\n", "not JSON"),
    ):
        with pytest.raises(ValueError, match=reason):
            read_kv_events_text(text)


def test_rows_must_be_lists_of_three():
    with pytest.raises(ValueError):
        changes_from_rows([[1.0, "S"]])
