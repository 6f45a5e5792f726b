"""Option parsing shared by commands: integer lists, sizes, positive numbers, fixed choices, help panels —
one-line errors."""

from __future__ import annotations

import inspect
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import typer

from kvbench.errors import KvbenchError
from kvbench.fileio import replaceable
from kvbench.models.shapes import DTYPE_BYTES
from kvbench.values import parse_threads

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def int_list(text: str, what: str, minimum: int = 1) -> list[int]:
    """``"10,30,50"`` -> [10, 30, 50]; every item an integer >= minimum; at least one item."""
    items = [item.strip() for item in text.split(",")] if text is not None else []
    if not items or all(item == "" for item in items):
        raise KvbenchError(f"{what} is empty; give a comma-separated list of integers such as 10,30,50")
    values = []
    for item in items:
        if not re.fullmatch(r"[+-]?[0-9]+", item):  # ASCII digits: "٣" is not a concurrency anyone typed
            raise KvbenchError(f"{what}: {item!r} is not an integer")
        value = int(item)
        if value < minimum:
            raise KvbenchError(f"{what}: {value} is below the minimum of {minimum}")
        if value in values:
            raise KvbenchError(f"{what} lists {value} twice; give each value once")
        values.append(value)
    return values


def name_list(text: str, what: str, allowed: tuple[str, ...]) -> list[str]:
    names = [item.strip() for item in text.split(",")]
    if not any(names):
        raise KvbenchError(f"{what} is empty; choose from {', '.join(allowed)}")
    if not all(names):  # "a,,b": a name left out, not a list to guess at
        raise KvbenchError(f"{what} {text!r} has an empty item; give names separated by single commas")
    singular = what[:-3] + "y" if what.endswith("ies") else what.removesuffix("s")  # strategies -> strategy
    for index, name in enumerate(names):
        if name not in allowed:
            raise KvbenchError(f"unknown {singular} {name!r}; choose from {', '.join(allowed)}")
        if name in names[:index]:
            raise KvbenchError(f"{what} lists {name!r} twice; give each {singular} once")
    return names


def run_directory(out: str | None) -> Path | None:
    """``--out``: None (a fresh directory under reports/) or a non-empty path (an empty one is not ".")."""
    if out is None:
        return None
    if not out.strip():
        raise KvbenchError("--out is empty; give a run directory, or leave --out out for reports/<command>-<time>")
    return Path(out)


def output_file(text: str | None, option: str) -> Path | None:
    """A file option taken as text: an empty one is refused by name (as a ``Path`` it would become "." and fail
    later as "cannot write ."), the rest is checked as :func:`writable_file`."""
    if text is None:
        return None
    if not text.strip():
        raise KvbenchError(f"{option} is empty; give a file path")
    return writable_file(Path(text), option)


def writable_file(path: Path | None, option: str) -> Path | None:
    """Check now, before any work, that ``path`` can be written (its folder exists and accepts files), so a
    long run does not fail at its very end.

    A single file goes into a folder that exists: kvbench never makes folders for it (a mistyped path would
    leave a tree behind). Run directories are kvbench's own and are created, with their parents
    (``report/rundir.py``)."""
    if path is None:
        return None
    if not str(path).strip():
        raise KvbenchError(f"{option} is empty; give a file path")
    if path.is_dir():
        raise KvbenchError(f"{option} {path} is a directory; give a file path")
    refused = replaceable(path)
    if refused is not None:
        raise KvbenchError(f"{option} {path} {refused}: kvbench replaces only regular files; give another path")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise KvbenchError(f"{option} {path}: the folder {folder} {what}; create it first or choose another path")
    try:
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".probe", delete=True)
        probe.close()
    except OSError as err:
        raise KvbenchError(f"{option} {path}: cannot write in {folder} ({err.strerror or err})") from None
    return path


MIN_RATE = 1e-3  # requests (or sessions) per second: slower, a run of a few hundred takes days to arrive
MAX_SIZE_BYTES = float(1 << 60)  # 1 EiB: no memory size a run could mean is larger


def parse_size(text: str, what: str = "size") -> int:
    """``"2GiB"``, ``"512MB"``, ``"1e9"`` -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([a-zA-Z]*)\s*", text or "")
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise KvbenchError(f"{what}: cannot read {text!r}; use e.g. 512MiB, 2GiB or a byte count")
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if not value < MAX_SIZE_BYTES:  # 1e999GiB reads as infinity
        raise KvbenchError(f"{what} {text!r} is more than any machine holds (at most 1 EiB)")
    size = int(value)
    if size <= 0:
        raise KvbenchError(f"{what} must be positive, got {text!r}")
    return size


def not_an_input(path: Path | None, option: str, inputs: Iterable[Path]) -> Path | None:
    """Refuse an output path that is one of the files the command reads (``report DIR --out DIR/summary.json``
    would replace the run's data with its own page)."""
    if path is None:
        return None
    for source in inputs:
        try:
            same = path.exists() and source.exists() and os.path.samefile(path, source)
        except OSError:
            same = False
        if same or path.resolve() == source.resolve():
            raise KvbenchError(f"{option} {path} is {source}, which this command reads; give another path")
    return path


def make_console(stderr: bool = False):
    """A rich console as wide as ``COLUMNS`` says, else the terminal; to a pipe or a CI log without ``COLUMNS``,
    wide enough that tables are not truncated."""
    import os

    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console = Console(stderr=stderr, width=max(console.width, 160))
    return console


MIN_UTILIZATION = 0.01  # below 1% of a GPU no model's weights fit: a smaller share is a typo, not a setting


def positive_fraction(value: float | None) -> float | None:
    """A Typer callback for shares such as --gpu-memory-utilization: in [0.01, 1]."""
    if value is not None and not MIN_UTILIZATION <= value <= 1:
        raise typer.BadParameter(f"{value} is not in [{MIN_UTILIZATION}, 1]")
    return value


def thread_count(text: str) -> int | None:
    """``--threads``: a positive number, or ``auto`` (None: measured when the model loads)."""
    try:
        return parse_threads(text)
    except KvbenchError as err:
        raise KvbenchError(f"--threads: {err}") from None


DEVICES = ("auto", "cpu", "cuda")  # what --device names (the engines also take cuda:N)
COMPUTE_DTYPES = tuple(DTYPE_BYTES)  # what --dtype names where a model runs


def choice(
    values: Sequence[str], what: str | None = None, *, case_sensitive: bool = True, also: str | None = None
) -> dict[str, Any]:
    """``typer.Option`` keywords for an option with a fixed set of values: its help shows them (``<a|b|c>``),
    the shell completes them, and another value is refused as soon as it is parsed, in one line naming ``what``
    (the flag, unless given) and the choices. ``also`` is a pattern of further accepted values (``cuda:\\d+``)."""
    values = tuple(values)

    def check(ctx, param, value):  # untyped: Typer passes (context, parameter, value) by position
        if value is None:
            return value
        given = value if case_sensitive else value.lower()
        if given not in values and not (also and re.fullmatch(also, given)):
            raise KvbenchError(f"unknown {what or _flag(param)} {value!r}; choose one of {', '.join(values)}")
        return value

    def complete(incomplete: str) -> list[str]:
        return [value for value in values if value.startswith(incomplete if case_sensitive else incomplete.lower())]

    return {"metavar": _metavar(values), "callback": check, "autocompletion": complete}


def device_choice() -> dict[str, Any]:
    """:func:`choice` of a device where a model runs: auto, cpu, cuda or cuda:N, in any case, as the engines read it."""
    return choice(DEVICES, "device", case_sensitive=False, also=r"cuda:\d+")


def choice_list(values: Sequence[str] | Callable[[], Sequence[str]], what: str) -> dict[str, Any]:
    """``typer.Option`` keywords for a comma-separated list drawn from a fixed set (``--engines paged,vllm``):
    shown as ``<a|b|c>,...``, completed item by item, checked as :func:`name_list` checks it. A callable is asked
    for the set at each check (a registry that may gain entries after the command is defined)."""
    current = values if callable(values) else (lambda: tuple(values))

    def check(ctx, param, value):
        if value is not None:
            name_list(value, what, tuple(current()))
        return value

    def complete(incomplete: str) -> list[str]:
        head, _, last = incomplete.rpartition(",")
        given = {item.strip() for item in head.split(",")} if head else set()
        prefix = f"{head}," if head else ""
        return [prefix + value for value in current() if value.startswith(last) and value not in given]

    return {"metavar": _metavar(tuple(current())) + ",...", "callback": check, "autocompletion": complete}


def completes(values: Iterable[str] | Callable[[], Iterable[str]]) -> dict[str, Any]:
    """``typer.Option`` keywords that complete an option from a long list of known values (GPU presets; a callable
    is asked when the shell asks) and leave its help and its checks as they are."""
    current = values if callable(values) else (lambda: tuple(values))

    def complete(incomplete: str) -> list[str]:
        return [value for value in current() if value.startswith(incomplete)]

    return {"autocompletion": complete}


def _metavar(values: tuple[str, ...]) -> str:
    """``<a|b|c>`` as Typer shows an enum's values; a long set with spaces, so the help's narrow type column
    breaks it between values rather than inside one."""
    joined = "|".join(values)
    return f"<{joined}>" if len(joined) <= 24 else f"<{' | '.join(values)}>"


def _flag(param: Any) -> str:
    """The parameter's long flag (``--reserve``), as errors name it."""
    opts = [opt for opt in getattr(param, "opts", ()) if opt.startswith("--")]
    return opts[0] if opts else str(getattr(param, "name", "value"))


def help_panels(panels: dict[str, Sequence[str]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Group a command's options in its help: ``{panel title: parameter names}``. Put it under
    ``RUN_OPTIONS`` (the shared options carry panels of their own); a name the command lacks is an error."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        parameters = inspect.signature(command).parameters
        for title, names in panels.items():
            for name in names:
                if name not in parameters or not isinstance(parameters[name].default, typer.models.ParameterInfo):
                    raise ValueError(f"{command.__name__} has no option parameter {name!r} for panel {title!r}")
                parameters[name].default.rich_help_panel = title
        return command

    return decorate
