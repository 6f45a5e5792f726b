"""Diagnosis thresholds: the seed article's defaults, a TOML file, then ``KEY=VALUE`` overrides; validated in one
place. Each threshold is described once, on its field (key, meaning, unit); help texts, the list of keys and the
checks are drawn from there."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

from kvbench import json_input
from kvbench.errors import KvbenchError

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")

# Units: a share is checked to lie in [0, 1], a duration to be Prometheus', anything else to be a number >= 0.
SHARE = "share"
DURATION = "duration"
UNITS = (SHARE, "ms", "per request", DURATION)


def _threshold(default: float | str, means: str, unit: str, key: str | None = None) -> Any:
    """A field with its one description: what it means, its unit, and its key in a file and in KEY=VALUE (the
    field's name unless given)."""
    return field(default=default, metadata={"means": means, "unit": unit, "key": key})


@dataclass(frozen=True)
class Thresholds:
    """The limit of each rule; a field's metadata says what it means, its unit and the key users set it by."""

    fragmentation: float = _threshold(0.3, "online fragmentation, 1 - used / allocated, above which it fires", SHARE)
    free_blocks: float = _threshold(
        0.10, "free blocks as a share of the pool below which headroom is too little", SHARE
    )
    alloc_latency_p99_ms: float = _threshold(50.0, "p99 of one block allocation call above which it fires", "ms")
    preemptions_per_request: float = _threshold(
        0.5, "preemptions per completed request above which it fires", "per request"
    )
    reservation_waste: float = _threshold(
        0.5, "reservation + internal waste as a share of the pool above which it fires", SHARE
    )
    low_kv_usage: float = _threshold(
        0.5, "KV usage below which waiting requests mean the batch cap, not memory, limits", SHARE
    )
    min_prefix_hit_rate: float = _threshold(
        0.0, "prefix-cache hits per queried token below which it fires (0: off)", SHARE
    )
    max_thrash_share: float = _threshold(
        0.1, "removed KV blocks the server stored again within the thrash window, above which it fires", SHARE
    )
    max_reuse_gap: float = _threshold(
        0.2, "how far the hit rate may fall below what an unbounded cache serves the same requests", SHARE
    )
    alert_for: str = _threshold("5m", "the Prometheus `for:` of the emitted alerts", DURATION, key="for")

    def validate(self) -> Thresholds:
        for described in KEYS.values():
            value = getattr(self, described.name)
            if described.unit == DURATION:
                if not isinstance(value, str) or not _DURATION.match(value):
                    raise KvbenchError(f"threshold {described.key}: {value!r} is not a Prometheus duration such as 5m")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise KvbenchError(f"threshold {described.key}: {value!r} must be a finite, non-negative number")
            if described.unit == SHARE and value > 1:
                raise KvbenchError(f"threshold {described.key}: {value!r} is a share, between 0 and 1")
        return self

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Described:
    """One threshold as a user names it: the key of a file and of KEY=VALUE, the field it sets, and its text."""

    key: str
    name: str  # the field of Thresholds
    means: str
    unit: str
    default: float | str

    def parse(self, text: str) -> float | str:
        """The value of a KEY=VALUE: text for a duration, else a float (range and finiteness: ``validate``)."""
        if self.unit == DURATION:
            return text
        try:
            return float(text)
        except ValueError:
            raise KvbenchError(f"{self.key}={text}: {text!r} is not a number") from None

    def shown(self) -> str:
        """``key=default``, as help texts list it."""
        value = self.default
        return f"{self.key}={value:g}" if isinstance(value, float) else f"{self.key}={value}"


KEYS: dict[str, Described] = {
    d.key: d
    for d in (
        Described(
            f.metadata.get("key") or f.name,
            f.name,
            f.metadata.get("means", ""),
            f.metadata.get("unit", ""),
            getattr(Thresholds(), f.name),
        )
        for f in fields(Thresholds)
    )
}


def unknown_key(key: str) -> str:
    """What a key no threshold has is told, whether it came from a file or a KEY=VALUE."""
    return f"unknown key {key!r}; known: {', '.join(KEYS)}"


def parse_assignments(texts: Iterable[str]) -> dict[str, float | str]:
    """``KEY=VALUE`` texts as values by field name, for ``load_thresholds``; each key at most once."""
    values: dict[str, float | str] = {}
    for text in texts:
        key, equals, value = text.partition("=")
        if not equals or not key:
            raise KvbenchError(f"{text}: expected KEY=VALUE, e.g. fragmentation=0.4")
        described = KEYS.get(key)
        if described is None:
            raise KvbenchError(f"{text}: {unknown_key(key)}")
        if described.name in values:
            raise KvbenchError(f"{text}: {key} given twice")
        values[described.name] = described.parse(value)
    return values


THRESHOLDS_FILE_BYTES = 1 << 20  # a thresholds file is a few lines


def load_thresholds(path: Path | None, **overrides: Any) -> Thresholds:
    """Defaults, then a TOML file (top-level keys or a [thresholds] table), then non-None ``overrides`` by field
    name (``parse_assignments`` makes them from KEY=VALUE texts)."""
    thresholds = Thresholds()
    if path is not None:
        try:
            data = tomllib.loads(json_input.read_text(path, THRESHOLDS_FILE_BYTES))  # a byte-order mark dropped
        except OSError as err:
            raise KvbenchError(f"cannot read thresholds file {path}: {err.strerror or err}") from None
        except UnicodeDecodeError:
            raise KvbenchError(f"thresholds file {path} is not UTF-8 text") from None
        except tomllib.TOMLDecodeError as err:
            raise KvbenchError(f"thresholds file {path} is not valid TOML: {err}") from None
        except RecursionError:  # tomllib parses nested arrays and tables by recursion
            raise KvbenchError(f"thresholds file {path} is not valid TOML: nested too deep") from None
        except ValueError:  # an integer of more digits than Python converts
            raise KvbenchError(f"thresholds file {path} is not valid TOML: a number too long to read") from None
        table = data.get("thresholds", data) if isinstance(data.get("thresholds"), dict) else data
        values: dict[str, Any] = {}
        for key, value in table.items():
            described = KEYS.get(key)
            if described is None:
                raise KvbenchError(f"thresholds file {path}: {unknown_key(key)}")
            values[described.name] = float(value) if isinstance(value, int) and not isinstance(value, bool) else value
        thresholds = replace(thresholds, **values)
    thresholds = replace(thresholds, **{k: v for k, v in overrides.items() if v is not None})
    return thresholds.validate()
