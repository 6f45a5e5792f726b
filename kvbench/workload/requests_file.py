"""Request files: JSONL of prompt token ids and output lengths, so real traces replay exactly.

One JSON object per line::

    {"prompt_token_ids": [1, 529, 29871], "output_len": 128}
    {"prompt_token_ids": [1, 3750], "max_tokens": 64, "prompt": "ignored text"}

``output_len`` (or its alias ``max_tokens``, vLLM's name) is the number of tokens to generate. Other keys (a
``prompt`` string, ids, timestamps) are ignored. Blank lines are skipped. Every problem is a one-line
:class:`KvbenchError` naming the file and line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.fileio import write_text_atomic
from kvbench.workload.jsonl import json_objects, read_text

RequestItem = tuple[list[int], int]  # (prompt token ids, output length)
OUTPUT_KEYS = ("output_len", "max_tokens")


def load_requests_jsonl(path: str | os.PathLike, vocab_size: int | None = None) -> list[RequestItem]:
    """Read ``(prompt_token_ids, output_len)`` per line; token ids are checked against ``vocab_size`` if given."""
    source = Path(path)
    items = [
        _parse_row(row, where, vocab_size) for where, row in json_objects(source, read_text(source, "requests file"))
    ]
    if not items:
        raise KvbenchError(f"requests file {source} holds no requests")
    return items


def write_requests_jsonl(path: str | os.PathLike, items: Iterable[tuple[Sequence[int], int]]) -> Path:
    """Write ``(prompt_token_ids, output_len)`` pairs as JSONL, atomically; ``load_requests_jsonl`` reads them back."""
    lines = []
    for number, item in enumerate(items, 1):
        try:
            ids, output_len = item
        except (TypeError, ValueError):
            raise KvbenchError(f"request {number}: expected a (prompt_token_ids, output_len) pair") from None
        where = f"request {number}"
        if hasattr(ids, "tolist"):  # a tensor or numpy array
            ids = ids.tolist()
        elif isinstance(ids, Sequence) and not isinstance(ids, str):
            ids = list(ids)
        row = {
            "prompt_token_ids": _token_ids(ids, where, None),
            "output_len": _output_len(output_len, f"{where}: output_len"),
        }
        lines.append(json.dumps(row, separators=(",", ":")))
    if not lines:
        raise KvbenchError("no requests to write")
    return write_text_atomic(path, "\n".join(lines) + "\n")


def _parse_row(row: dict, where: str, vocab_size: int | None) -> RequestItem:
    if "prompt_token_ids" not in row:
        raise KvbenchError(f"{where}: prompt_token_ids is missing")
    ids = _token_ids(row["prompt_token_ids"], where, vocab_size)
    present = [key for key in OUTPUT_KEYS if row.get(key) is not None]
    if not present:
        raise KvbenchError(f"{where}: output_len (or max_tokens) is missing")
    lengths = {key: _output_len(row[key], f"{where}: {key}") for key in present}
    if len(set(lengths.values())) > 1:
        raise KvbenchError(
            f"{where}: output_len ({lengths['output_len']}) and max_tokens ({lengths['max_tokens']}) disagree"
        )
    return ids, lengths[present[0]]


def _token_ids(ids: object, where: str, vocab_size: int | None) -> list[int]:
    if not isinstance(ids, list):
        raise KvbenchError(f"{where}: prompt_token_ids must be a list of token ids, got {type(ids).__name__}")
    if not ids:
        raise KvbenchError(f"{where}: prompt_token_ids is empty")
    for position, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int):
            raise KvbenchError(f"{where}: token id at position {position} is not an integer: {token!r}")
        if token < 0:
            raise KvbenchError(f"{where}: token id at position {position} is negative: {token}")
        if vocab_size is not None and token >= vocab_size:
            raise KvbenchError(
                f"{where}: token id {token} at position {position} is outside the vocabulary (size {vocab_size})"
            )
    return list(ids)


def _output_len(value: object, what: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise KvbenchError(f"{what} must be a positive integer, got {value!r}")
    if value < 1:
        raise KvbenchError(f"{what} must be a positive integer, got {value}")
    return value
