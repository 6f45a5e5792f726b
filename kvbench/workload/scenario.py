"""Scenario files (TOML): a workload, a KV budget and sweep defaults, validated with clear errors."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

from kvbench.errors import KvbenchError
from kvbench.kv.policies import ADMISSION_MODES, RESERVATION_POLICIES, check_choice
from kvbench.models.gpus import kv_budget, resolve_gpu
from kvbench.models.resolve import resolve_model
from kvbench.workload.dataset import builtin_datasets
from kvbench.workload.lengths import LengthSpec

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "description": str,
    "max_len": int,
    "mean_len": int,
    "distribution": str,
    "sigma": (int, float),
    "prompt_ratio": (int, float),
    "requests": int,
    "warmup": int,
    "concurrency": list,
    "block_size": int,
    "reserve": str,
    "admission": str,
    "seed": int,
    "budget": dict,
    "samples": int,
    "waves": int,
    "dataset": str,
}
_LENGTH_FIELDS = ("max_len", "mean_len", "distribution", "prompt_ratio", "sigma")  # the LengthSpec's
_BUDGET_FIELDS: dict[str, type | tuple[type, ...]] = {
    "model": str,
    "gpu": str,
    "utilization": (int, float),
    "slots": int,
}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    lengths: LengthSpec = field(default_factory=LengthSpec)
    requests: int = 60
    warmup: int = 4
    concurrency: tuple[int, ...] = (10, 30, 50)
    block_size: int = 16
    reserve: str = "max"
    admission: str = "queue"
    seed: int = 0
    budget: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    samples: int = 1  # parallel samples per request (paged: forked, sharing the prompt's blocks)
    waves: int = 0  # requests per point at least waves x concurrency, so the full load holds a while (0: off)
    dataset: str = ""  # prompts from a dataset (a shipped name or a path relative to the scenario file)

    def requests_for(self, concurrency: int) -> int:
        """Requests of a point at ``concurrency``: ``requests``, or ``waves`` closed-loop waves if that is more."""
        return max(self.requests, self.waves * concurrency)

    def dataset_path(self) -> Path | None:
        """The scenario's dataset: a name kvbench ships, else a path (relative to the scenario file)."""
        if not self.dataset:
            return None
        builtin = builtin_datasets().get(self.dataset)
        if builtin is not None:
            return builtin
        path = Path(self.dataset)
        if not path.is_absolute() and self.source:
            path = Path(self.source).parent / path
        if not path.is_file():
            raise KvbenchError(f"scenario {self.name}: dataset {self.dataset} not found ({path})")
        return path

    def budget_slots(self) -> tuple[int, str]:
        """Token slots of the KV pool and a sentence saying where the number comes from."""
        if "slots" in self.budget:
            return self.budget["slots"], f"{self.budget['slots']:,} token slots (set by the scenario)"
        shape = resolve_model(self.budget.get("model", "llama-2-13b"))
        gpu = resolve_gpu(self.budget.get("gpu", "a100-80g"))
        utilization = float(self.budget.get("utilization", 0.9))
        budget = kv_budget(shape, gpu, utilization)
        if not budget.fits:
            raise KvbenchError(f"scenario {self.name}: {shape.name} does not fit on {gpu.name}; no KV budget to derive")
        slots = budget.kv_bytes // shape.bytes_per_token
        return slots, (
            f"{slots:,} token slots = the KV budget of {shape.name} {shape.dtype} on {gpu.name} at "
            f"{utilization} utilization, scaled to this model by slots"
        )


def builtin_scenarios() -> dict[str, Path]:
    folder = resources.files("kvbench.scenarios")
    return {Path(entry.name).stem: Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith(".toml")}


def load_scenario(spec: str) -> Scenario:
    """A built-in scenario name or a path to a TOML file."""
    builtins = builtin_scenarios()
    path = builtins.get(spec) or Path(spec)
    if not path.is_file():
        raise KvbenchError(f"unknown scenario {spec!r}: not built in ({', '.join(sorted(builtins))}) and no such file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is not TOML: dropped
    except (OSError, UnicodeDecodeError) as err:
        raise KvbenchError(f"cannot read scenario {path}: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise KvbenchError(f"scenario {path}: invalid TOML ({err})") from None
    except RecursionError:  # tomllib parses nested arrays and tables by recursion
        raise KvbenchError(f"scenario {path}: invalid TOML (nested too deep)") from None
    except ValueError:  # an integer of more digits than Python converts
        raise KvbenchError(f"scenario {path}: invalid TOML (a number too long to read)") from None
    return parse_scenario(data, name=path.stem, source=str(path))


def parse_scenario(data: dict[str, Any], name: str, source: str = "") -> Scenario:
    """A validated scenario; every field left out takes the default of ``Scenario`` or ``LengthSpec``."""
    where = f"scenario {source or name}"
    _check_fields(data, _FIELDS, where)
    budget = data.get("budget", {})
    _check_fields(budget, _BUDGET_FIELDS, f"{where} [budget]")
    if "concurrency" in data:
        concurrency = data["concurrency"]
        if not concurrency or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in concurrency):
            raise KvbenchError(f"{where}: concurrency must be a non-empty list of positive integers")
        twice = next((c for index, c in enumerate(concurrency) if c in concurrency[:index]), None)
        if twice is not None:  # like --concurrency 2,2: a point measured twice would be written twice
            raise KvbenchError(f"{where}: concurrency lists {twice} twice; give each value once")
    for key in ("requests", "block_size", "max_len", "mean_len", "samples"):
        if key in data and data[key] < 1:
            raise KvbenchError(f"{where}: {key} must be positive, got {data[key]}")
    for key in ("warmup", "waves"):
        if data.get(key, 0) < 0:
            raise KvbenchError(f"{where}: {key} must be >= 0")
    try:
        for key, allowed, what in (
            ("reserve", RESERVATION_POLICIES, "reserve"),
            ("admission", ADMISSION_MODES, "admission"),
        ):
            if key in data:
                check_choice(data[key], allowed, what)
    except KvbenchError as err:
        raise KvbenchError(f"{where}: {err}") from None
    if "slots" in budget and budget["slots"] < 1:
        raise KvbenchError(f"{where}: budget.slots must be positive")
    derived = [key for key in ("model", "gpu", "utilization") if key in budget]
    if "slots" in budget and derived:
        raise KvbenchError(
            f"{where}: [budget] gives slots and {', '.join(derived)}: the slots set the pool, the others would be "
            "ignored; keep one way"
        )
    length_fields = {key: data[key] for key in _LENGTH_FIELDS if key in data}
    for key in ("prompt_ratio", "sigma"):
        if key in length_fields:
            length_fields[key] = float(length_fields[key])
    try:
        lengths = LengthSpec(**length_fields)
    except KvbenchError as err:
        raise KvbenchError(f"{where}: {err}") from None
    fields = {key: value for key, value in data.items() if key not in (*_LENGTH_FIELDS, "budget")}
    if "concurrency" in fields:
        fields["concurrency"] = tuple(fields["concurrency"])
    return Scenario(name=name, lengths=lengths, budget=dict(budget), source=source, **fields)


def _check_fields(data: dict, allowed: dict[str, type | tuple[type, ...]], where: str) -> None:
    for key, value in data.items():
        if key not in allowed:
            raise KvbenchError(f"{where}: unknown field {key!r}; known: {', '.join(allowed)}")
        expected = allowed[key]
        if isinstance(value, bool) or not isinstance(value, expected):
            names = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
            raise KvbenchError(f"{where}: field {key!r} must be {names}, got {value!r}")
