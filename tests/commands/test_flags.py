"""Each flag is declared once (``commands/_flags.py`` for those several commands take): the same names, range and
checks wherever it is given, so a flag cannot mean one thing to one command and refuse another's value."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kvbench.cli import COMMANDS, load_command
from kvbench.commands._flags import Flag, flag

COMMANDS_DIR = Path(__file__).resolve().parents[2] / "kvbench" / "commands"


def _declarations() -> dict[str, list[str]]:
    """Where each flag is declared: a ``typer.Option(...)`` outside the catalogue, or a ``flag(...)`` in it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(COMMANDS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            typer_option = isinstance(func, ast.Attribute) and func.attr == "Option" and path.name != "_flags.py"
            catalogued = isinstance(func, ast.Name) and func.id == "flag" and path.name == "_flags.py"
            if typer_option or catalogued:
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")]
                found[names[0] if names else "?"].append(f"{path.name}:{node.lineno}")
    return found


def test_every_flag_is_declared_in_one_place():
    twice = {name: places for name, places in _declarations().items() if len(places) > 1}
    assert not twice, f"declared more than once (give the catalogue's flag instead): {twice}"


def _shared_params() -> dict[str, list[tuple[str, object]]]:
    by_flag: dict[str, list[tuple[str, object]]] = defaultdict(list)
    for name in COMMANDS:
        for param in load_command(name).params:
            by_flag[param.opts[0]].append((name, param))
    return {flag_name: params for flag_name, params in by_flag.items() if len(params) > 1}


def test_a_flag_several_commands_take_has_the_same_names_and_range_in_each():
    shared = _shared_params()
    assert {"--block-size", "--max-len", "--model", "--seed", "--requests", "--threads"} <= set(shared)
    for flag_name, params in shared.items():
        names = {(tuple(p.opts), tuple(p.secondary_opts)) for _, p in params}
        assert len(names) == 1, f"{flag_name}: names differ between {[c for c, _ in params]}: {names}"
        ranges = {(p.min, p.max) for _, p in params}
        assert len(ranges) == 1, f"{flag_name}: ranges differ: {ranges}"
        checks = {getattr(p.callback, "__wrapped__", p.callback) for _, p in params}  # one check object per flag
        assert len(checks) == 1, f"{flag_name}: checked differently: {checks}"


@pytest.mark.parametrize(
    "argv",
    [
        ["capacity", "--max-len", "1"],
        ["waste", "--max-len", "1"],
        ["share", "--n", "2", "--max-len", "1"],
        ["serve", "--max-len", "1"],
        ["dataset", "real-chat", "--max-len", "1"],
        ["reuse", "--max-model-len", "1"],
    ],
)
def test_one_value_is_refused_alike_by_every_command_that_takes_the_flag(argv, capsys):
    from kvbench.cli import main

    assert main(argv) == 2
    assert "'--max-len' / '--max-model-len': Input should be greater than or equal to 2" in capsys.readouterr().err


def test_a_command_gives_the_default_and_its_own_help_and_the_flag_keeps_its_checks():
    size = flag("--size", help="Tokens per thing.", min=1)
    assert isinstance(size, Flag)
    app = typer.Typer()
    seen: list[int] = []

    @app.command()
    def command(value: int = size(16, "Tokens per thing, here.")) -> None:
        seen.append(value)

    runner = CliRunner()
    assert runner.invoke(app, []).exit_code == 0 and seen == [16]
    assert runner.invoke(app, ["--size", "0"]).exit_code == 2
    assert "Tokens per thing, here." in runner.invoke(app, ["--help"]).output


# a meaning's second names, folded into the one flag other commands give it: none may come back as a flag of its own
SECOND_NAMES = {
    "--interval": "--scrape-interval",
    "--url": "--metrics-url",
    "--reps": "--repeat",
    "--kv-cache-memory": "--kv-memory",
    "--prompts": "--requests",
    "--wide": "--verbose",
    "--waterfall": "--verbose",
    **{
        f"--{name}": "--threshold"  # diagnose's thresholds: KEY=VALUE by the thresholds file's keys
        for name in (
            "max-fragmentation",
            "min-free-blocks",
            "max-alloc-latency-ms",
            "max-preemptions-per-request",
            "max-reservation-waste",
            "low-kv-usage",
            "min-prefix-hit-rate",
            "max-thrash-share",
            "max-reuse-gap",
            "alert-for",
        )
    },
}


def test_a_meaning_has_one_name_in_every_command():
    taken: dict[str, set[str]] = defaultdict(set)
    for name in COMMANDS:
        for param in load_command(name).params:
            for option in (*param.opts, *getattr(param, "secondary_opts", ())):
                taken[option].add(name)
    back = {old: sorted(taken[old]) for old in SECOND_NAMES if old in taken}
    assert not back, f"second names for one meaning are flags again (use the one name): {back}"
    assert all(new in taken for new in SECOND_NAMES.values())
