"""The ``kvbench`` command line: a thin Typer layer. Command modules live in ``kvbench.commands``."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from kvbench import __version__
from kvbench.errors import KvbenchError

app = typer.Typer(
    name="kvbench",
    help="Benchmark and diagnose the KV cache of LLM inference: paged vs contiguous, side by side.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kvbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version."),
) -> None:
    """kvbench: where does KV-cache memory go, and what does paging buy?"""


def _register_commands() -> None:
    import kvbench.commands as commands_pkg

    for info in sorted(pkgutil.iter_modules(commands_pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvbench.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_commands()


def _click_exception_types() -> tuple[type, ...]:
    types: list[type] = []
    try:
        import click

        types.append(click.exceptions.ClickException)
    except ImportError:
        pass
    try:
        from typer._click import exceptions as vendored  # typer >= 0.20 ships its own click

        types.append(vendored.ClickException)
    except ImportError:
        pass
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
    except MemoryError:
        typer.echo("error: out of memory; use a smaller model, fewer requests or a smaller KV pool", err=True)
        return 2
    except Exception as err:  # usage errors from click (typer may vendor its own copy)
        if isinstance(err, _click_exception_types()):
            if type(err).__name__ == "NoArgsIsHelpError" or not hasattr(err, "format_message"):
                err.show()  # `kvbench` alone, or a group without a command: the help text is the answer
            else:
                command = getattr(getattr(err, "ctx", None), "command_path", "kvbench")
                typer.echo(f"error: {err.format_message()} (see `{command} --help`)", err=True)
            return err.exit_code
        raise
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
