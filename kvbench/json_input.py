"""Reading JSON that comes from outside (datasets, requests files, traces, ``config.json``, run summaries,
timelines): the one reader every such file goes through.

Python's ``json`` parses nesting by recursion: ten thousand ``[`` end in a ``RecursionError`` traceback, and a
document just under that depth breaks whatever walks it next. :func:`loads` measures nesting first, in one pass
without recursion, and refuses more than :data:`MAX_DEPTH` levels (no kvbench file needs more than a handful) as a
``json.JSONDecodeError``, so every caller's existing "not valid JSON" path reports it in one line.
:func:`read_text` reads a file as UTF-8 with or without a byte-order mark (Windows editors write one), refusing one
larger than the caller allows.
"""

from __future__ import annotations

import json
import os
import re
import stat
from itertools import accumulate
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError

MAX_DEPTH = 64
MAX_BYTES = 2 << 30  # the default cap of read_text: large datasets (ShareGPT is ~0.7 GB), not unbounded
_BOM = "\ufeff"


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` with a leading byte-order mark ignored and nesting deeper than ``max_depth`` refused
    (a ``json.JSONDecodeError``, like any other malformed JSON)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8-sig")
    elif text.startswith(_BOM):
        text = text[1:]
    if text.count("[") + text.count("{") > max_depth and _nesting(text) > max_depth:  # counts first: cheap
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", text, 0)
    if "\\u" in text and (lone := _LONE_SURROGATE.search(text)) is not None:  # no text: it cannot be written
        raise json.JSONDecodeError("a lone surrogate (\\ud800-\\udfff) is not text", text, lone.start())
    try:
        return json.loads(text)
    except RecursionError:  # a caller already deep in its own stack
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", text, 0) from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer of more digits than Python converts (4,300): no kvbench figure has them
        raise json.JSONDecodeError("a number with more digits than can be read", text, 0) from None


_LONE_SURROGATE = re.compile(  # an escaped high surrogate without its low one, or a low one without its high
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included: its brackets are text
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _nesting(text: str) -> int:
    """How deep lists and objects nest in ``text``, read in one pass without recursion (the strings taken out
    first, then the brackets summed, in C-speed passes)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def read_text(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> str:
    """A file's text as UTF-8, a byte-order mark dropped; a file over ``max_bytes`` is refused in one line.
    ``OSError`` and ``UnicodeDecodeError`` reach the caller, who names the file's role."""
    source = Path(path)
    info = source.stat()
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read for ever; a device never ends
        raise KvbenchError(f"{source} is not a regular file")
    size = info.st_size
    if size > max_bytes:
        raise KvbenchError(f"{source} is {size:,} bytes, more than the {max_bytes:,} this file may hold")
    with source.open("rb") as handle:
        data = handle.read(max_bytes + 1)  # a file that grew since stat() is cut at the cap, then refused
    if len(data) > max_bytes:
        raise KvbenchError(f"{source} is more than the {max_bytes:,} bytes this file may hold")
    return data.decode("utf-8-sig")
