"""Reading JSON-lines files of objects with one-line errors that say which line is wrong."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench import json_input
from kvbench.errors import KvbenchError


def read_text(source: Path, label: str) -> str:
    """The file's text, or a one-line error naming it as ``label`` ("trace file", "requests file")."""
    if not source.exists():
        raise KvbenchError(f"{label} not found: {source}")
    if not source.is_file():
        raise KvbenchError(f"{label} is not a file: {source}")
    try:
        return json_input.read_text(source)
    except (OSError, UnicodeDecodeError) as err:
        raise KvbenchError(f"cannot read {label} {source}: {err}") from None


def json_objects(source: Path, text: str) -> list[tuple[str, dict]]:
    """``(where, object)`` for each non-blank line, ``where`` being ``path:line`` for error messages."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            row = json_input.loads(line)
        except json.JSONDecodeError as err:
            raise KvbenchError(f"{where}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise KvbenchError(f"{where}: expected a JSON object, got {type(row).__name__}")
        rows.append((where, row))
    return rows
