"""Option parsing shared by commands: fixed choices (help, completion, one-line refusal) and help panels."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from kvbench.cli import load_command, main
from kvbench.commands._options import DEVICES, choice, choice_list, completes, help_panels
from kvbench.studies.fleet.routing import POLICIES


def _app(**option) -> tuple[typer.Typer, list]:
    seen: list = []

    def command(value: str | None = typer.Option(None, "--value", **option)) -> None:
        seen.append(value)

    app = typer.Typer()
    app.command()(command)
    return app, seen


def test_a_choice_is_shown_completed_and_checked_as_parsed():
    options = choice(("max", "pow2", "oracle"))
    assert options["metavar"] == "<max|pow2|oracle>"
    assert options["autocompletion"]("p") == ["pow2"]
    assert options["autocompletion"]("") == ["max", "pow2", "oracle"]
    app, seen = _app(**options)
    assert CliRunner().invoke(app, ["--value", "pow2"]).exit_code == 0 and seen == ["pow2"]
    assert CliRunner().invoke(app, []).exit_code == 0 and seen[-1] is None  # no value, no check
    refused = CliRunner().invoke(app, ["--value", "most"])
    assert str(refused.exception) == "unknown --value 'most'; choose one of max, pow2, oracle"
    assert seen == ["pow2", None]  # refused before the command ran


def test_a_choice_may_ignore_case_and_accept_a_pattern():
    options = choice(DEVICES, "device", case_sensitive=False, also=r"cuda:\d+")
    app, seen = _app(**options)
    for value in ("auto", "CPU", "cuda:1"):
        assert CliRunner().invoke(app, ["--value", value]).exit_code == 0
    assert seen == ["auto", "CPU", "cuda:1"]  # as given: the engine's own parser reads it
    assert (
        str(CliRunner().invoke(app, ["--value", "gpu"]).exception)
        == "unknown device 'gpu'; choose one of auto, cpu, cuda"
    )
    assert str(CliRunner().invoke(app, ["--value", "cuda:x"]).exception).startswith("unknown device 'cuda:x'")
    assert options["autocompletion"]("C") == ["cpu", "cuda"]


def test_a_long_set_of_values_breaks_between_values_in_the_help():
    assert (
        choice(("fixed", "uniform", "exponential", "lognormal"))["metavar"]
        == "<fixed | uniform | exponential | lognormal>"
    )


def test_a_list_of_choices_completes_item_by_item_and_refuses_as_name_list_does():
    options = choice_list(("paged", "contiguous", "vllm"), "engines")
    assert options["metavar"] == "<paged|contiguous|vllm>,..."
    complete = options["autocompletion"]
    assert complete("") == ["paged", "contiguous", "vllm"]
    assert complete("paged,") == ["paged,contiguous", "paged,vllm"]  # what is listed is not offered again
    assert complete("paged,contiguous,v") == ["paged,contiguous,vllm"]
    app, seen = _app(**options)
    assert CliRunner().invoke(app, ["--value", "contiguous,paged"]).exit_code == 0 and seen == ["contiguous,paged"]
    assert (
        str(CliRunner().invoke(app, ["--value", "paged,tgi"]).exception)
        == "unknown engine 'tgi'; choose from paged, contiguous, vllm"
    )
    assert (
        str(CliRunner().invoke(app, ["--value", "paged,paged"]).exception)
        == "engines lists 'paged' twice; give each engine once"
    )


def test_completes_only_completes():
    options = completes(("a100-40g", "a100-80g", "h100-80g"))
    assert set(options) == {"autocompletion"} and options["autocompletion"]("a100") == ["a100-40g", "a100-80g"]


def test_help_panels_group_options_and_refuse_a_name_the_command_lacks():
    @help_panels({"Load": ("rate",)})
    def command(rate: float = typer.Option(1.0, "--rate"), out: str = typer.Option("x", "--out")) -> None:
        pass

    app = typer.Typer()
    app.command()(command)
    text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100", "TERMINAL_WIDTH": "100"}).output
    load = text[text.index("─ Load ") :]
    assert "--rate" in load and "--out" not in load and "--out" in text[: text.index("─ Load ")]
    with pytest.raises(ValueError, match="no option parameter 'speed'"):
        help_panels({"Load": ("speed",)})(command)


# ---------------------------------------------------------------------------------------------- in the commands

CHOICES = [  # (command line before the option, option, its values)
    (["sweep"], "--engines", ("paged", "contiguous", "vllm")),
    (["sweep"], "--stop", ("eos", "length")),
    (["sweep"], "--device", ("auto", "cpu", "cuda")),
    (["sweep"], "--dtype", ("auto", "fp32", "fp16", "bf16")),
    (["sweep"], "--reserve", ("max", "pow2", "oracle")),
    (["sweep"], "--admission", ("queue", "reject")),
    (["fleet"], "--engine", ("paged", "contiguous")),
    (["fleet"], "--policies", tuple(POLICIES)),  # the registry, in its order (tests/studies/fleet names them)
    (["serve"], "--engine", ("paged", "contiguous")),
    (["serve"], "--device", ("auto", "cpu", "cuda")),
    (["serve"], "--dtype", ("auto", "fp32", "fp16", "bf16")),
    (["serve"], "--reserve", ("max", "pow2", "oracle")),
    (["serve"], "--admission", ("queue", "reject")),
    (["share"], "--reserve", ("max", "pow2", "oracle")),
    (["share"], "--device", ("auto", "cpu", "cuda")),
    (["share"], "--stop", ("eos", "length")),
    (["waste"], "--dtype", ("auto", "fp32", "fp16", "bf16")),
    (["waste"], "--kv-cache-dtype", ("auto", "fp32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")),
    (["waste"], "--distribution", ("fixed", "uniform", "exponential", "lognormal")),
    (["waste"], "--stop", ("eos", "length")),
    (["waste"], "--strategies", ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged")),
    (["capacity"], "--dtype", ("auto", "fp32", "fp16", "bf16")),
    (["capacity"], "--kv-cache-dtype", ("auto", "fp32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")),
    (["kernels"], "--device", ("auto", "cpu", "cuda")),
    (["kernels"], "--dtype", ("auto", "fp32", "fp16", "bf16")),
    (["kernels"], "--backend", ("auto", "torch", "triton", "native")),
]


@pytest.mark.parametrize("command, option, values", CHOICES, ids=lambda v: v if isinstance(v, str) else None)
def test_each_fixed_choice_is_listed_in_the_help_and_completed(command, option, values, capsys, monkeypatch):
    import typer.rich_utils

    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 400)  # wide enough that no row wraps
    assert main([*command, "--help"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.split()[1:2] == [option])
    assert "<str>" not in row
    shown = row[row.index("<") + 1 : row.index(">")].replace(" ", "").split("|")
    assert shown == list(values)
    param = next(p for p in load_command(command[0]).params if option in p.opts)
    assert [item.value for item in param.shell_complete(None, "")] == list(values)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sweep", "--simulate", "--device", "gpu"], "error: unknown device 'gpu'; choose one of auto, cpu, cuda"),
        (["sweep", "--dtype", "fp64"], "error: unknown --dtype 'fp64'; choose one of auto, fp32, fp16, bf16"),
        (["sweep", "--engines", "paged,turbo"], "error: unknown engine 'turbo'; choose from paged, contiguous, vllm"),
        (["sweep", "--reserve", "most"], "error: unknown --reserve 'most'; choose one of max, pow2, oracle"),
        (["serve", "--admission", "drop"], "error: unknown --admission 'drop'; choose one of queue, reject"),
        (["share", "--n", "2", "--device", "tpu"], "error: unknown device 'tpu'; choose one of auto, cpu, cuda"),
        (
            ["fleet", "--simulate", "--policies", "fastest"],
            "error: unknown policy 'fastest'; choose from round-robin, "
            "random, least-requests, most-free-blocks, prefix-affinity, approx-prefix, precise-prefix",
        ),
        (
            ["kernels", "--backend", "cublas"],
            "error: unknown backend 'cublas'; choose one of auto, torch, triton, native",
        ),
        (
            ["capacity", "--kv-cache-dtype", "fp4"],
            "error: unknown --kv-cache-dtype 'fp4'; choose one of auto, fp32, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2, "
            "int8",
        ),
    ],
)
def test_a_value_outside_the_choices_is_one_line_and_exit_2_before_any_work(
    argv, message, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # a run that started would leave reports/ here
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == message
    assert list(tmp_path.iterdir()) == []
