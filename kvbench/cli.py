"""The ``kvbench`` command line: a thin Typer layer over the command modules in ``kvbench.commands``.

The CLI starts at once: :data:`COMMANDS` names each command, the module that defines it and the one line the
top-level help shows, so ``kvbench --help`` and ``kvbench --version`` import no command module (and with them no
torch, scipy or matplotlib); a command's module is imported only when that command runs, completes or shows its
own help. ``tests/test_cli_startup.py`` keeps the table equal to the commands' own help texts.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from kvbench.errors import KvbenchError


@dataclass(frozen=True)
class CommandEntry:
    module: str  # where the command's ``register(app)`` lives
    summary: str  # the first paragraph of the command's help: one line in ``kvbench --help``


COMMANDS: dict[str, CommandEntry] = {
    "sweep": CommandEntry(
        "kvbench.commands.sweep_cmd", "Paged and contiguous engines side by side per concurrency: TPS, latency, memory."
    ),
    "waste": CommandEntry(
        "kvbench.commands.waste_cmd", "Where KV memory goes per strategy: token states, reservation and fragmentation."
    ),
    "capacity": CommandEntry(
        "kvbench.commands.capacity_cmd", "Weights, KV budget and the requests each KV strategy holds, per GPU."
    ),
    "reuse": CommandEntry(
        "kvbench.commands.reuse_cmd",
        "Prefix hit rate of a trace for each size of KV memory, on a planned deployment.",
    ),
    "share": CommandEntry(
        "kvbench.commands.share_cmd", "KV memory with and without block sharing, for parallel sampling and beam search."
    ),
    "dataset": CommandEntry(
        "kvbench.commands.dataset_cmd", "Prompt and answer lengths of a dataset and the waste estimate they imply."
    ),
    "fleet": CommandEntry(
        "kvbench.commands.fleet_cmd", "Several instances behind a router: every routing policy on the same arrivals."
    ),
    "serve": CommandEntry(
        "kvbench.commands.serve_cmd", "Serve one engine over the OpenAI API, with live Prometheus metrics."
    ),
    "watch": CommandEntry(
        "kvbench.commands.watch_cmd", "Watch a live metrics endpoint's KV cache, recorded as a timeline and a plot."
    ),
    "diagnose": CommandEntry(
        "kvbench.commands.diagnose_cmd", "Find KV-cache trouble in a run, a watch timeline or a live metrics endpoint."
    ),
    "compare": CommandEntry(
        "kvbench.commands.compare_cmd", "Compare HEAD's run with BASE's; exit 1 on a regression or a missing point."
    ),
    "report": CommandEntry("kvbench.commands.report_cmd", "Build a run's self-contained report.html from its files."),
    "kernels": CommandEntry(
        "kvbench.commands.kernels_cmd", "Time paged decode attention: GB/s achieved and ratio to contiguous SDPA."
    ),
    "scenarios": CommandEntry(
        "kvbench.commands.scenarios_cmd", "List the built-in scenarios with a one-line description."
    ),
}

# What `pip install kvbench` brings that a light install (the README's) may lack: module -> package to install.
FULL_INSTALL = {
    "torch": "torch",
    "transformers": "transformers",
    "safetensors": "safetensors",
    "prometheus_client": "prometheus-client",
    "aiohttp": "aiohttp",
    "pynvml": "nvidia-ml-py",
    "huggingface_hub": "huggingface_hub",
    "scipy": "scipy",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
    "jinja2": "jinja2",
    "yaml": "pyyaml",
    "numpy": "numpy",
}

_SETTINGS: dict[str, Any] = {"pretty_exceptions_enable": False}  # what the app and every command's app share


def _is_flag(param: Any) -> bool:
    return getattr(param, "is_flag", False) and not getattr(param, "count", False)


def _without_flag_types(params: list[Any]) -> None:
    """A flag takes no value, so its help row shows no type (Typer's rich help prints ``<bool>`` for every
    boolean parameter, as if ``--resume`` took one): an empty metavar is what that row prints instead."""
    for param in params:
        if _is_flag(param) and param.metavar is None:
            param.metavar = ""


def _unwrapped(text: str | None) -> str | None:
    """Paragraphs as single lines, so the terminal wraps them to its width: rich help keeps every line break
    of the source, which would cut sentences where the source file wraps."""
    if text is None:
        return None
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in text.strip().split("\n\n"))


class KvbenchCommand(TyperCommand):
    """A command whose help shows flags without a type and paragraphs without the source's line breaks."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _without_flag_types(self.get_params(ctx))
        super().format_help(ctx, formatter)


class _CommandApp(typer.Typer):
    """What a command module's ``register(app)`` registers on: its commands built as :class:`KvbenchCommand`."""

    def command(self, name: str | None = None, *, cls: type | None = None, **kwargs: Any):
        return super().command(name, cls=cls or KvbenchCommand, **kwargs)


def load_command(name: str) -> Any:
    """The click command ``name``, built from its module (imported now)."""
    module = importlib.import_module(COMMANDS[name].module)
    app = _CommandApp(add_completion=False, **_SETTINGS)
    module.register(app)
    command = typer.main.get_group(app).commands[name]
    command.help = _unwrapped(command.help)
    return command


class _LazyCommands(Mapping):
    """The command table as click's ``commands`` mapping: a name's module is imported when it is looked up."""

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in COMMANDS:
            raise KeyError(name)
        if name not in self._loaded:
            self._loaded[name] = load_command(name)
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class KvbenchGroup(TyperGroup):
    """The top level: commands listed from :data:`COMMANDS` (help, completion of names, suggestions on a typo)
    without importing them; the one that runs is imported when it is resolved."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # click declares a dict of commands; this Mapping answers the same reads without importing them
        self.commands = _LazyCommands()  # type: ignore[assignment]
        self._listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if self._listing:  # a row of the help or a completion: the table's line is all that is shown
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].summary, short_help=COMMANDS[cmd_name].summary)
        return self.commands[cmd_name]

    @contextmanager
    def _only_listing(self) -> Iterator[None]:
        self._listing = True
        try:
            yield
        finally:
            self._listing = False

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _without_flag_types(self.get_params(ctx))
        with self._only_listing():
            super().format_help(ctx, formatter)

    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        with self._only_listing():  # completing a command's name; its options resolve the real command
            return super().shell_complete(ctx, incomplete)


app = typer.Typer(
    name="kvbench",
    cls=KvbenchGroup,
    help="Benchmark and diagnose the KV cache of LLM inference: paged vs contiguous, side by side.",
    no_args_is_help=True,
    add_completion=True,
    **_SETTINGS,
)


def _version_callback(value: bool) -> None:
    if value:
        from kvbench import __version__

        typer.echo(f"kvbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version."
    ),
) -> None:
    """kvbench: where does KV-cache memory go, and what does paging buy?"""


def _click_exception_types() -> tuple[type, ...]:
    types: list[type] = []
    try:
        from typer._click import exceptions as vendored  # typer >= 0.20 ships its own click

        types.append(vendored.ClickException)
    except ImportError:
        pass
    if "click" in sys.modules:  # an older typer raises click's own; importing click only to test costs time
        types.append(sys.modules["click"].exceptions.ClickException)
    return tuple(types)


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors become one line on stderr and exit code 2, never a traceback."""
    try:
        result = app(args=argv, standalone_mode=False, prog_name="kvbench")
    except KvbenchError as err:
        typer.echo(f"error: {err}", err=True)
        return err.exit_code
    except typer.Exit as done:
        return done.exit_code
    except SystemExit as done:  # --show-completion, --install-completion and completion itself end this way
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        return 130
    except OSError as err:  # a full disk, a read-only or vanished folder: the system's words, on one line
        where = f": {err.filename}" if getattr(err, "filename", None) else ""
        typer.echo(f"error: {err.strerror or err}{where}", err=True)
        return 2
    except ModuleNotFoundError as err:  # a light install running a command that needs the full one
        package = FULL_INSTALL.get((err.name or "").partition(".")[0])
        if package is None:
            raise
        typer.echo(
            f"error: this command needs {package}, which is not installed (pip install {package}; "
            "`pip install kvbench` installs what every command needs)",
            err=True,
        )
        return 2
    except MemoryError:
        typer.echo("error: out of memory; use a smaller model, fewer requests or a smaller KV pool", err=True)
        return 2
    except Exception as err:  # usage errors from click (typer may vendor its own copy)
        if isinstance(err, _click_exception_types()):
            usage: Any = err  # click's ClickException or typer's vendored copy: two classes, one interface
            if type(err).__name__ == "NoArgsIsHelpError" or not hasattr(err, "format_message"):
                usage.show()  # `kvbench` alone, or a group without a command: the help text is the answer
            else:
                command = getattr(getattr(err, "ctx", None), "command_path", "kvbench")
                typer.echo(f"error: {err.format_message()} (see `{command} --help`)", err=True)
            return usage.exit_code
        raise
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
