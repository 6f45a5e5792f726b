"""The entry point: it starts at once (a command's module is imported only when that command runs), and its last
line of defence turns system errors into one line and a non-zero exit."""

from __future__ import annotations

import errno
import importlib
import json
import os
import pkgutil
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

import kvbench.commands as commands_package
from kvbench import cli
from kvbench.cli import main
from kvbench.commands import _run as run_module
from kvbench.studies import waste as waste_study


def test_a_full_disk_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r" / "summary.json"))

    monkeypatch.setattr(run_module, "write_summary", full)  # the one tail every study writes through
    assert main(["waste", "--requests", "20", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: No space left on device: {tmp_path / 'r' / 'summary.json'}"


def test_running_out_of_memory_is_one_line(monkeypatch, capsys):
    def hungry(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(waste_study, "run_strategy", hungry)
    assert main(["waste", "--requests", "20", "--out", "/tmp/kvbench-oom-test"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: out of memory")


def test_the_version_is_pyprojects(capsys):
    """The version is written once, in pyproject.toml; the package reads it from its installed metadata."""
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kvbench {project['project']['version']}"


# ---------------------------------------------------------------------------------------------- starting at once

HEAVY = (
    "torch",
    "transformers",
    "safetensors",
    "numpy",
    "scipy",
    "pandas",
    "matplotlib",
    "jinja2",
    "pydantic",
    "aiohttp",
    "ray",
)

# Runs kvbench's entry point with argv in a fresh interpreter, then reports on stderr's last line what it imported.
STARTUP_PROBE = """
import json, sys
from kvbench.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _probe(*argv: str, columns: int = 100) -> tuple[dict, str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    env.pop("TERMINAL_WIDTH", None)
    done = subprocess.run(
        [sys.executable, "-c", STARTUP_PROBE, *argv], capture_output=True, text=True, env=env, timeout=120
    )
    return json.loads(done.stderr.strip().splitlines()[-1]), done.stdout


@pytest.mark.parametrize(
    "argv, code", [(["--version"], 0), (["--help"], 0), ([], 2)], ids=["version", "help", "no arguments"]
)
def test_version_and_help_import_no_command_and_no_heavy_package(argv, code):
    report, out = _probe(*argv)
    assert report["code"] == code  # alone, `kvbench` shows the help and exits 2, as click does
    assert "kvbench" in out
    kvbench_modules = {m for m in report["modules"] if m == "kvbench" or m.startswith("kvbench.")}
    assert kvbench_modules <= {"kvbench", "kvbench.cli", "kvbench.errors"}
    assert [m for m in HEAVY if m in report["modules"]] == []


@pytest.mark.parametrize("command", ["diagnose", "report", "watch"])
def test_reading_a_run_imports_no_statistics_or_engine_package(command):
    """Reading a result (a typed point) costs no scipy: its spreads are computed where a run aggregates them."""
    report, _ = _probe(command, "--help")
    assert report["code"] == 0
    assert [m for m in ("scipy", "torch", "transformers", "pandas", "ray") if m in report["modules"]] == []


def test_help_lists_every_command_on_one_line_each():
    report, out = _probe("--help", columns=100)
    assert report["code"] == 0
    rows = [line for line in out.splitlines() if line.startswith("│ ")]
    for name, entry in cli.COMMANDS.items():
        assert any(line.split()[1:2] == [name] and entry.summary in line for line in rows), name
    commands_panel = out[out.index("Commands") :]
    assert len([line for line in commands_panel.splitlines() if line.startswith("│")]) == len(cli.COMMANDS)


def _registered() -> dict[str, str]:
    """Every command the modules of kvbench.commands register, with the module that registers it."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(commands_package.__path__):
        module = importlib.import_module(f"kvbench.commands.{info.name}")
        if hasattr(module, "register"):
            app = cli._CommandApp(add_completion=False)
            module.register(app)
            for command in app.registered_commands:
                assert command.name not in found, f"{command.name} registered twice"
                found[command.name] = module.__name__
    return found


def test_the_command_table_names_every_command_and_its_module():
    assert {name: entry.module for name, entry in cli.COMMANDS.items()} == _registered()


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_the_tables_line_is_the_commands_own_first_paragraph(name):
    """The top-level help shows the table's line; a command's own help starts with the same paragraph, so the
    two cannot drift apart. One line, short enough for a 100-column terminal."""
    summary = cli.COMMANDS[name].summary
    command = cli.load_command(name)
    assert command.help.split("\n\n")[0] == summary
    assert "\n" not in summary and len(summary) <= 80 and summary.endswith(".")


def test_a_typo_still_gets_a_suggestion(capsys):
    assert main(["sweeep"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: No such command 'sweeep'. Did you mean 'sweep'? (see `kvbench --help`)"
    )


def test_only_the_command_that_runs_is_imported():
    report, _ = _probe("scenarios")
    assert report["code"] == 0
    loaded = {m for m in report["modules"] if m.startswith("kvbench.commands.") and m.endswith("_cmd")}
    assert loaded == {"kvbench.commands.scenarios_cmd"}


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_flags_show_no_value_type(name, capsys):
    """A flag takes no value: its help row has no ``<bool>`` (Typer prints one for every boolean)."""
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert "<bool>" not in out
    assert "--help" in out


def test_the_root_help_shows_its_flags_without_a_type(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "<bool>" not in out and "--version" in out and "--install-completion" in out


# ---------------------------------------------------------------------------------------------- shell completion


def _complete(words: str) -> list[str]:
    """What bash completion offers after ``words`` (the last word being completed), in a fresh interpreter."""
    parts = words.split(" ")
    env = {**os.environ, "_KVBENCH_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)}
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from kvbench.cli import main; sys.exit(main())"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_completion_of_command_names_loads_no_command():
    assert _complete("kvbench s") == ["sweep", "share", "serve", "scenarios"]


def test_completion_of_fixed_choices():
    assert _complete("kvbench waste --stop ") == ["eos", "length"]
    assert _complete("kvbench capacity --kv-cache-dtype fp8") == ["fp8", "fp8_e4m3", "fp8_e5m2"]
    assert _complete("kvbench waste --strategies paged,contiguous-") == [
        "paged,contiguous-max",
        "paged,contiguous-pow2",
        "paged,contiguous-oracle",
    ]


def test_show_completion_prints_a_script():
    """Run from a bash shell, as a user types it: Typer finds the shell among the process's ancestors (a test
    runner started without a shell has none to find)."""
    if shutil.which("bash") is None:
        pytest.skip("no bash on this machine")
    code = "import sys; from kvbench.cli import main; sys.exit(main(['--show-completion']))"
    done = subprocess.run(
        ["bash", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert "_kvbench_completion" in script and "_KVBENCH_COMPLETE=complete_bash" in script
