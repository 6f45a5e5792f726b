"""Diagnosis thresholds: the seed article's defaults, a TOML file, then flags; validated in one place."""

from __future__ import annotations

import math
import re
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

from kvbench import json_input
from kvbench.errors import KvbenchError

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


@dataclass(frozen=True)
class Thresholds:
    fragmentation: float = 0.3  # online fragmentation 1 - used / allocated
    free_blocks: float = 0.10  # free blocks as a share of the pool (below: too little headroom)
    alloc_latency_p99_ms: float = 50.0  # p99 of one block allocation call
    preemptions_per_request: float = 0.5  # preemptions per completed request
    reservation_waste: float = 0.5  # reservation + internal as a share of the pool
    low_kv_usage: float = 0.5  # requests waiting while KV usage is below this: the batch cap, not memory, limits
    min_prefix_hit_rate: float = 0.0  # prefix-cache hits per queried token below this fire (0: off)
    max_thrash_share: float = 0.1  # removed KV blocks the server stored again within the thrash window
    max_reuse_gap: float = 0.2  # hit rate this far below what an unbounded cache serves the same requests
    alert_for: str = "5m"  # Prometheus `for:` of the emitted alerts

    FRACTIONS = (
        "fragmentation",
        "free_blocks",
        "reservation_waste",
        "low_kv_usage",
        "min_prefix_hit_rate",
        "max_thrash_share",
        "max_reuse_gap",
    )

    def validate(self) -> Thresholds:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "alert_for":
                if not isinstance(value, str) or not _DURATION.match(value):
                    raise KvbenchError(f"threshold alert_for: {value!r} is not a Prometheus duration such as 5m")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise KvbenchError(f"threshold {f.name}: {value!r} must be a non-negative number")
            if f.name in self.FRACTIONS and value > 1:
                raise KvbenchError(f"threshold {f.name}: {value!r} is a share, between 0 and 1")
        return self

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


THRESHOLDS_FILE_BYTES = 1 << 20  # a thresholds file is a few lines


def load_thresholds(path: Path | None, **overrides: Any) -> Thresholds:
    """Defaults, then a TOML file (top-level keys or a [thresholds] table), then non-None ``overrides``."""
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
        known = {f.name for f in fields(Thresholds)}
        values: dict[str, Any] = {}
        for key, value in table.items():
            name = "alert_for" if key == "for" else key
            if name not in known:
                raise KvbenchError(f"thresholds file {path}: unknown key {key!r}; known: {', '.join(sorted(known))}")
            values[name] = float(value) if isinstance(value, int) and not isinstance(value, bool) else value
        thresholds = replace(thresholds, **values)
    thresholds = replace(thresholds, **{k: v for k, v in overrides.items() if v is not None})
    return thresholds.validate()
