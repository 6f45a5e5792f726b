"""Fuzzed run directories: a run's files come from anyone (a CI artifact, a colleague's folder, a hand edit), so
`kvbench report` and `kvbench compare` answer whatever they hold with a page, a verdict or a one-line error
(exit 0, 1 or 2), never a traceback.

Real runs are made once per module through the command line (a waste run and a small simulated sweep), then
each example changes a copy: a field anywhere in summary.json (mostly in its points) replaced by another value
(null, text with ``$`` and ``<script>``, huge, negative and non-finite numbers, written as raw JSON such as
``1e999``, lists, nested objects) or deleted, the file cut short or replaced by random bytes; for the sweep its
per-point timeline too.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvbench.cli import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-runs")
    made = {
        "waste": ["waste", "--requests", "20", "--strategies", "contiguous-max,paged"],
        "sweep": ["sweep", "--simulate", "--requests", "20", "--concurrency", "2,4"],
    }
    for name, argv in made.items():
        assert main([*argv, "--json", "--out", str(root / name)]) == 0
        for picture in (root / name).glob("*.png"):  # the report draws its own: smaller copies per example
            picture.unlink()
    return {name: root / name for name in made}


# Raw JSON no Python value is written as (json.dumps writes NaN and Infinity itself): put in by placeholder.
RAW = {
    "1e999": "1e999",
    "-1e999": "-1e999",
    "big": "1" * 400,
    "-0": "-0",
    "tiny": "5e-324",
}
TEXT = st.sampled_from(
    [
        "",
        "$x$",
        "$\\frac{$",
        "<script>alert(1)</script>",
        "../../etc/passwd",
        "a/b",
        "\x00",
        "\ud800",
        "%s%d{}",
        "ok",
        "paged",
        "contiguous",
        "sweep",
        "waste",
        " ",
        "1" * 300,
    ]
) | st.text(max_size=10)
NUMBERS = (
    st.integers()
    | st.sampled_from([0, -1, 1, 2**53 + 1, 2**63, -(2**63), 10**30])
    | st.floats()
    | st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324])
)
RAW_NUMBERS = st.sampled_from(sorted(RAW)).map(lambda name: f"\0RAW:{name}")  # a placeholder, see dumps()
SCALARS = st.none() | st.booleans() | NUMBERS | TEXT | RAW_NUMBERS
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
) | st.integers(1, 60).map(lambda depth: json.loads("[" * depth + "]" * depth))


def dumps(document) -> str:
    text = json.dumps(document)
    for name, raw in RAW.items():
        text = text.replace(json.dumps(f"\0RAW:{name}"), raw)
    return text


@dataclass(frozen=True)
class Change:
    """One change to a JSON file of the run. ``path`` leads from the root: a name is that key, a number picks
    the n-th key or item (modulo); a value replaces what it leads to by one of the same type when it has one
    (which gets past the schema check, on to the pages), else by ``anything``."""

    file: str
    kind: str  # replace | replace-any | delete | truncate (at ``cut``) | bytes (the file is ``junk``)
    path: tuple = ()
    number: object = 0
    text: str = ""
    anything: object = None
    cut: int = 0
    junk: bytes = b""


def changes(files: list[str]) -> st.SearchStrategy:
    steps = st.integers(0, 500)
    paths = st.one_of(
        st.lists(steps, max_size=5),
        st.lists(steps, min_size=2, max_size=4).map(lambda p: ["points", *p]),  # a point's field, mostly
        st.lists(steps, min_size=2, max_size=4).map(lambda p: ["points", *p]),
    ).map(tuple)
    change = st.builds(
        Change,
        file=st.sampled_from(files),
        kind=st.sampled_from(["replace"] * 6 + ["replace-any", "delete", "delete", "truncate", "bytes"]),
        path=paths,
        number=st.one_of(NUMBERS, RAW_NUMBERS),
        text=TEXT,
        anything=VALUES,
        cut=st.integers(0, 1 << 16),
        junk=st.binary(max_size=64),
    )
    return st.lists(change, min_size=1, max_size=3)


def apply(change: Change, document):
    """``document`` after ``change`` (one of replace, replace-any or delete)."""
    parent, key, node = None, None, document
    for step in change.path:
        if isinstance(node, dict) and node:
            step = step if step in node else sorted(node)[step % len(node) if isinstance(step, int) else 0]
        elif isinstance(node, list) and node:
            step = step % len(node) if isinstance(step, int) else 0
        else:
            break
        parent, key, node = node, step, node[step]
    if parent is None:  # the whole document
        return change.anything
    if change.kind == "delete":
        del parent[key]
    elif change.kind == "replace" and isinstance(node, (int, float)) and not isinstance(node, bool):
        parent[key] = change.number
    elif change.kind == "replace" and isinstance(node, str):
        parent[key] = change.text
    else:
        parent[key] = change.anything
    return document


def write_changed(directory: Path, plan: list[Change]) -> None:
    for change in plan:
        path = directory / change.file
        if change.kind == "bytes":
            path.write_bytes(change.junk)
        elif change.kind == "truncate":
            data = path.read_bytes()
            path.write_bytes(data[: change.cut % (len(data) + 1)])
        else:
            try:
                document = json.loads(path.read_text())
            except ValueError:  # an earlier change left no JSON to change
                continue
            path.write_text(dumps(apply(change, document)))


def open_figures() -> int:
    import matplotlib.pyplot as plt

    return len(plt.get_fignums())


def check_commands(base: Path, plan: list[Change], capsys) -> None:
    """report and compare (both ways) of a copy of ``base`` changed by ``plan``: exit 0, 1 or 2, no traceback,
    and no figure left open (a plot that failed half-way must close its figure too)."""
    with tempfile.TemporaryDirectory() as root:
        head = Path(root) / base.name
        shutil.copytree(base, head)
        write_changed(head, plan)
        figures = open_figures()
        codes = [
            main(["report", str(head), "--out", str(Path(root) / "r.html")]),
            main(["compare", str(base), str(head)]),
            main(["compare", str(head), str(base)]),
        ]
        leaked = open_figures() - figures
    err = capsys.readouterr().err
    assert all(code in (0, 1, 2) for code in codes), (codes, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert all(line.startswith("error: ") for line in err.splitlines() if line.strip()), err[-2000:]  # one line each
    assert leaked == 0, f"{leaked} figure(s) left open; {err[-500:]}"


FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BIG = "\0RAW:big"  # an integer of 400 digits: more than a float holds


# An integer past a float's range was an OverflowError out of compare (values.is_number: math.isfinite of it).
@FUZZ
@given(plan=changes(["summary.json"]))
@example(plan=[Change("summary.json", "replace", ("points", 0, "completed"), number=BIG)])
def test_any_change_to_a_waste_run_is_reported_or_refused_in_one_line(runs, plan, capsys):
    check_commands(runs["waste"], plan, capsys)


# A number past a float's range where the sweep plots it was an OverflowError traceback out of the report; a
# plot that failed (that way, or with a text where a number goes) left its figure open: 20 failed reports in one
# process and matplotlib warns of too many figures. A lone surrogate (the JSON escape "\ud800") was a
# UnicodeEncodeError: in meta, out of the report as it wrote the page; in an engine name, out of compare as it
# printed (and the report's error was matplotlib's message of several lines).
@settings(FUZZ, max_examples=25)
@given(plan=changes(["summary.json", "summary.json", "timeline-paged-c4.json"]))
@example(plan=[Change("summary.json", "replace", ("points", 0, "output_throughput"), number=BIG)])
@example(plan=[Change("summary.json", "replace", ("points", 0, "concurrency"), number=BIG)])
@example(plan=[Change("summary.json", "replace-any", ("points", 0, "output_throughput"), anything="abc")])
@example(plan=[Change("summary.json", "replace", ("meta", "command"), text="\ud800")])
@example(plan=[Change("summary.json", "replace", ("points", 0, "engine"), text="\ud800")])
def test_any_change_to_a_sweep_run_is_reported_or_refused_in_one_line(runs, plan, capsys):
    check_commands(runs["sweep"], plan, capsys)
