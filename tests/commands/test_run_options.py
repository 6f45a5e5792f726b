"""The options sweep and fleet share, declared once, and the run lifecycle both go through; the option groups that
declare options once for several commands (run, deployment)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from kvbench.commands._option_group import SharedOption, from_settings
from kvbench.commands._run import Run
from kvbench.commands._run_options import RUN_OPTIONS, SHARED_OPTIONS
from kvbench.errors import KvbenchError
from kvbench.fileio import DirectoryLock
from kvbench.studies.run_options import RunOptions


def _app(**overrides) -> tuple[typer.Typer, list]:
    seen: list = []

    @RUN_OPTIONS.add(**overrides)
    def command(width: int = typer.Option(3, "--width"), *, run: RunOptions) -> None:
        seen.append((width, run))

    app = typer.Typer()
    app.command()(command)
    return app, seen


def test_the_shared_options_arrive_parsed_as_one_run_options():
    app, seen = _app()
    result = CliRunner().invoke(
        app, ["--width", "5", "--kv-memory", "2MiB", "--reserve", "pow2", "--seed", "7", "--simulate"]
    )
    assert result.exit_code == 0, result.output
    width, run = seen[0]
    assert width == 5 and run.kv_memory == (2 * 1024 * 1024, "2MiB") and run.reserve == "pow2"
    assert (run.seed, run.simulate, run.device, run.scenario) == (7, True, "auto", "article")
    assert {option.name for option in SHARED_OPTIONS} == {"kv_memory", *RunOptions.__dataclass_fields__} - {
        "kv_memory_bytes",
        "kv_memory_text",
    }


def test_a_command_changes_a_default_or_a_help_text_but_not_the_flag():
    app, seen = _app(defaults={"device": "cpu"}, helps={"seed": "Seed of everything here."})
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert "Seed of everything here." in result.output and "--kv-memory" in result.output
    CliRunner().invoke(app, [])
    assert seen[0][1].device == "cpu"
    with pytest.raises(ValueError, match="no shared option named colour"):
        RUN_OPTIONS.add(defaults={"colour": "red"})


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kv-memory", "lots"], "--kv-memory: cannot read 'lots'"),
        (["--reserve", "some"], "unknown --reserve 'some'"),
        (["--admission", "maybe"], "unknown --admission 'maybe'"),
    ],
)
def test_bad_shared_values_name_their_flag(args, message):
    app, _ = _app()
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, KvbenchError) and message in str(result.exception)


def test_a_group_takes_its_defaults_from_the_settings_dataclass_and_leaves_out_what_a_command_lacks():
    """waste has no --kv-memory (parsed as unset), reuse's model and GPU defaults are ReuseSettings', and a
    size that does not parse names its flag in each command that shares it."""
    from kvbench.cli import app
    from kvbench.commands._deployment_options import DEPLOYMENT
    from kvbench.commands._option_group import settings_defaults
    from kvbench.studies.reuse import ReuseSettings

    runner = CliRunner()
    wide = {"COLUMNS": "400", "TERMINAL_WIDTH": "400"}
    waste_help = runner.invoke(app, ["waste", "--help"], env=wide).output
    assert "--tensor-parallel-size" in waste_help and "--kv-memory" not in waste_help
    reuse_help = runner.invoke(app, ["reuse", "--help"], env=wide).output
    assert f"[default: {ReuseSettings.model}]" in reuse_help and f"[default: {ReuseSettings.gpu}]" in reuse_help
    assert settings_defaults(ReuseSettings, DEPLOYMENT.names)["gpu"] == ReuseSettings.gpu
    for command in ("capacity", "waste", "reuse"):
        result = runner.invoke(app, [command, "--gpu-memory", "plenty"])
        assert result.exit_code != 0 and "--gpu-memory: cannot read 'plenty'" in str(result.exception or "")
    with pytest.raises(ValueError, match="no shared option named colour"):
        DEPLOYMENT.add(without=("colour",))


@dataclass
class Settings:
    width: int = 3
    source: Path | None = None


def test_shared_options_take_their_type_and_default_from_the_settings_dataclass():
    width, source, size = from_settings(
        Settings,
        {
            "width": typer.Option("--width"),
            "source": typer.Option("--source"),
            "size": SharedOption("size", str | None, None, typer.Option("--size")),  # held in another form
        },
    )
    assert (width.annotation, width.default) == (int, 3) and (source.annotation, source.default) == (Path | None, None)
    assert size.name == "size" and size.default is None
    with pytest.raises(ValueError, match="no field 'height'"):
        from_settings(Settings, {"height": typer.Option("--height")})
    run_defaults = {o.name: o.default for o in SHARED_OPTIONS}
    assert run_defaults["model"] == RunOptions.model and run_defaults["gpu"] == RunOptions.gpu  # one declaration


@dataclass
class Given:
    width: str = "3"  # as typed, where Settings holds it parsed
    colour: str = "red"


def test_of_several_settings_the_first_with_the_field_gives_the_option_and_a_field_keeps_its_name():
    width, colour, source = from_settings(
        (Given, Settings),
        {"width": typer.Option("--width"), "colour": typer.Option("--colour"), "source": typer.Option("--from")},
    )
    assert (width.annotation, width.default) == (str, "3") and colour.default == "red"
    assert (source.name, source.flag, source.default) == ("source", "--from", None)
    with pytest.raises(ValueError, match="Given or Settings has no field 'height'"):
        from_settings((Given, Settings), {"height": typer.Option("--height")})


def test_the_target_options_take_endpoint_options_defaults_and_name_their_flags():
    from kvbench.commands._target_options import TARGET_OPTIONS
    from kvbench.studies.run_options import EndpointOptions

    by_flag = {o.flag: o for o in TARGET_OPTIONS}
    assert len(by_flag) == len(TARGET_OPTIONS)
    timeout = by_flag["--request-timeout"]
    assert (timeout.name, timeout.default) == ("request_timeout_s", EndpointOptions.request_timeout_s)
    assert by_flag["--thrash-window"].default == EndpointOptions.thrash_window_s
    assert (by_flag["--rate"].annotation, by_flag["--max-len"].default) == (str | None, None)  # the text, parsed later


def test_a_run_that_measured_nothing_leaves_no_directory_and_lets_go_in_reverse(tmp_path):
    released: list[str] = []
    run = Run("sweep")
    run.hold(lambda: released.append("backend"))
    run.hold(lambda: released.append("metrics"))
    with pytest.raises(KvbenchError), run.guarded(lambda: released.append("interrupted")):
        run.open(tmp_path / "new")
        raise KvbenchError("bad input found late")
    assert not (tmp_path / "new").exists() and released == ["metrics", "backend"]


def test_a_run_keeps_a_directory_with_points_and_exits_130_on_ctrl_c(tmp_path):
    notes: list[str] = []
    run = Run("fleet")
    with pytest.raises(typer.Exit) as stopped, run.guarded(lambda: notes.append("kept")):
        path = run.open(tmp_path / "kept")
        run.points.append({"engine": "paged"})
        (path / "results.jsonl").write_text("{}\n")
        raise KeyboardInterrupt
    assert stopped.value.exit_code == 130 and notes == ["kept"]
    assert (tmp_path / "kept" / "results.jsonl").exists() and (tmp_path / "kept" / DirectoryLock.FILE).exists()


@pytest.mark.parametrize("command", ["sweep", "fleet", "serve"])
@pytest.mark.parametrize(
    "args, message",
    [
        (["--kv-memory", "lots"], "error: --kv-memory: cannot read 'lots'"),
        (["--block-size", "0"], "--block-size"),
        (["--dtype", "fp64"], "error: unknown --dtype 'fp64'"),
    ],
)
def test_sweep_fleet_and_serve_share_one_declaration_of_the_pool_and_model_options(capsys, command, args, message):
    """The three commands take these flags from one declaration (RUN_OPTIONS): the same value is refused the
    same way, in one line, before anything starts."""
    from kvbench.cli import main

    code = main([command, *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
