"""Which matmul path each of a model's weights takes at each row count, measured on this CPU at start-up.

The paths (:mod:`kvbench.cpu.cpu_linear`: the plain weight through torch's BLAS, oneDNN's packed copy, for
bfloat16-valued float32 weights the bfloat16-weight kernel or AMX, for bfloat16 weights the vdpbf16ps kernel; both
kernels read their copy two ways, streamed or not, timed as two paths) differ by machine, by 2-3x and in either
direction, so none is chosen by a rule. For each weight the runner multiplies (the model's first layer stands for
all: q/k/v, o, gate/up, down; and the lm_head) every candidate path is timed at a few row counts, from a decode
step's one row to a long prefill's thousand, with interleaved rounds (the minimum of each counts, so a busy
neighbour hurts every path alike), and for a model larger than the CPU's last-level cache with the cache emptied
before each call, as the run will find it. Each row count takes its fastest path, held to few copies: the path
fastest at the most row counts is the weight's main one, and another takes a row count only where it is at least
:data:`TIE` faster (a weight may so keep two packed copies, counted by pre-flight, or none when the plain weight won
everywhere). A step's row count takes the choice of the nearest row count measured (on a log scale).

The plan is cached per machine and model shape (:mod:`kvbench.cpu.measured_cache`) and printed with its
timings. ``KVBENCH_MATMUL=plain|oneDNN|bf16-weights|bf16-weights-stream|AMX|bf16-dot|bf16-dot-stream|packed``
forces one path everywhere for tests and A/B benchmarks (the kernels' paths only where their kernel takes the
weight, else oneDNN; ``packed``: AMX where it takes the weight, else oneDNN).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from kvbench import env_settings
from kvbench.cpu import cpu_linear, measured_cache
from kvbench.cpu.cpu_linear import AMX, BF16DOT, BF16DOT_STREAM, BF16W, BF16W_STREAM, ONEDNN, PLAIN
from kvbench.kernels import cpu_native, cpu_peak

ROWS = (1, 16, 64, 256, 1024)  # the row counts timed: decode steps up to long prefills
LM_HEAD_ROWS = (1, 16, 64)  # the lm_head multiplies one row per request
MIN_ROUNDS, MAX_ROUNDS = 3, 25  # interleaved rounds per row count; the minimum of each path counts
MAX_ROUNDS_COLD = 6  # with the cache emptied before each call (which costs a few milliseconds)
BUDGET_S = 0.03  # rounds go on (up to MAX_ROUNDS) until this much was spent per row count: short calls get many
SLOW_CALL_S = 0.05  # a call slower than this is timed once more after its warm-up
TIE = 1.05  # a path other than the weight's main one must be at least this much faster at a row count to take it
DECISION_RULE = 2  # bumped when _decide changes: a plan cached under another rule is measured again
FORCE_ENV = "KVBENCH_MATMUL"
FORCED = {
    "plain": PLAIN,
    "onednn": ONEDNN,
    "bf16-weights": BF16W,
    "bf16-weights-stream": BF16W_STREAM,
    "amx": AMX,
    "bf16-dot": BF16DOT,
    "bf16-dot-stream": BF16DOT_STREAM,
    "packed": "packed",
}  # packed: AMX where it takes the weight, else oneDNN
_PLAN_ATTR = "_kvbench_matmul_plan"  # on the model: the plan its runners follow


@dataclass(frozen=True)
class MatmulChoice:
    """One weight's choice: the path at each row count measured (and so the packed copies it needs)."""

    role: str
    shape: tuple[int, int]
    rows: tuple[int, ...]
    paths: tuple[str, ...]  # the path at each of ``rows``
    timings_us: dict[int, dict[str, float]] = field(default_factory=dict)  # rows -> path -> microseconds

    @property
    def copies(self) -> tuple[str, ...]:
        """The packed copies the chosen paths need (none when the plain weight won everywhere; the vdpbf16ps
        kernel's two ways of reading share one)."""
        return tuple(dict.fromkeys(cpu_linear.copy_kind(path) for path in self.paths if path != PLAIN))

    def path_at(self, rows: int) -> str:
        """The path a step of ``rows`` rows takes: that of the nearest row count measured (on a log scale: the
        boundaries lie at the geometric means of neighbouring row counts)."""
        return self.paths[sum(rows >= bound for bound in self._bounds()[1:-1])]

    def _bounds(self) -> list[int]:
        middles = (math.ceil(math.sqrt(a * b)) for a, b in zip(self.rows, self.rows[1:], strict=False))
        return [0, *middles, 1 << 62]

    def routes(self) -> cpu_linear.Routes:
        """Which path each row count takes: ``(lo, hi, path)``, neighbouring row counts of one path merged."""
        bounds = self._bounds()
        routes: list[tuple[int, int, str]] = []
        for index, path in enumerate(self.paths):
            low, high = bounds[index], bounds[index + 1]
            if routes and routes[-1][2] == path:
                low = routes.pop()[0]
            routes.append((low, high, path))
        return tuple(routes)

    def describe(self) -> str:
        """``qkv_proj [960 x 576]: oneDNN-packed at 1-1024 rows; us plain/oneDNN-packed: 1 row 45/58, 16: 256/116``."""
        spans: list[str] = []
        start = 0
        for index in range(1, len(self.rows) + 1):
            if index == len(self.rows) or self.paths[index] != self.paths[start]:
                span = f"{self.rows[start]}" if index - 1 == start else f"{self.rows[start]}-{self.rows[index - 1]}"
                spans.append(f"{self.paths[start]} at {span} rows")
                start = index
        text = f"{self.role} [{self.shape[0]} x {self.shape[1]}]: {', '.join(spans)}"
        if self.timings_us:
            names = list(next(iter(self.timings_us.values())))
            cells = [
                f"{rows}{' row' if index == 0 else ''} " + "/".join(f"{timings[name]:.0f}" for name in names)
                for index, (rows, timings) in enumerate(self.timings_us.items())
            ]
            text += f"; us {'/'.join(names)}: {', '.join(cells)}"
        return text

    def as_dict(self) -> dict:
        return {
            "shape": list(self.shape),
            "rows": list(self.rows),
            "paths": list(self.paths),
            "timings_us": {str(rows): timings for rows, timings in self.timings_us.items()},
        }


@dataclass(frozen=True)
class MatmulPlan:
    """Every weight role's choice, for one model at one thread count."""

    threads: int
    dtype: torch.dtype
    choices: dict[str, MatmulChoice]
    source: str  # how it came to be: measured now / cached / forced

    def choice(self, role: str) -> MatmulChoice:
        return self.choices[role]

    def copies(self, num_layers: int) -> list[tuple[tuple[int, int], str, int]]:
        """The packed copies a runner will make, as (shape, path, count): what pre-flight counts."""
        return [
            (choice.shape, path, 1 if role == "lm_head" else num_layers)
            for role, choice in self.choices.items()
            for path in choice.copies
        ]

    def summary(self) -> str:
        """One line: which paths the weights take, e.g. ``oneDNN-packed for 5 of 7 weights, plain for 2``."""
        used: dict[str, int] = {}
        for choice in self.choices.values():
            for path in dict.fromkeys(choice.paths):
                used[path] = used.get(path, 0) + 1
        parts = [f"{path} for {count}" for path, count in sorted(used.items(), key=lambda item: -item[1])]
        if parts:
            parts[0] += f" of {len(self.choices)} weights"
        return f"matmul paths {', '.join(parts)} ({self.source})"

    def brief(self) -> str:
        """A few words: the paths the weights take, e.g. ``matmuls by row count: oneDNN-packed, plain``."""
        used = dict.fromkeys(path for choice in self.choices.values() for path in choice.paths)
        return f"matmuls by row count: {', '.join(used)}" if len(used) > 1 else f"matmuls {next(iter(used), 'plain')}"

    def lines(self) -> list[str]:
        """The plan as printed: a heading with its provenance, then one line per weight."""
        return [
            f"CPU matmul paths, {self.threads} thread(s), {_dtype_name(self.dtype)} ({self.source}):",
            *(f"  {choice.describe()}" for choice in self.choices.values()),
        ]

    def as_dict(self) -> dict:
        return {
            "threads": self.threads,
            "dtype": _dtype_name(self.dtype),
            "source": self.source,
            "weights": {role: choice.as_dict() for role, choice in self.choices.items()},
        }


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def last_level_cache_bytes() -> int:
    """The CPU's last-level cache (L3) in bytes, from sysfs; 32 MiB where it cannot be read."""
    try:
        return cpu_peak.sysfs_size_bytes((cpu_peak.CPU_ROOT / "cpu0/cache/index3/size").read_text())
    except (OSError, ValueError):
        return 32 << 20


class _Evictor:
    """Reads a buffer twice the size of the last-level cache, so the next call finds its weights in memory, as
    a run over a model larger than the cache does (each layer's weights are long gone when it comes round again)."""

    def __init__(self) -> None:
        self.buffer = torch.ones(min(2 * last_level_cache_bytes(), 512 << 20) // 4)

    def __call__(self) -> None:
        self.buffer.sum()


def _time_paths(
    weight: torch.Tensor, rows_list: tuple[int, ...], paths: tuple[str, ...], cold: bool = False
) -> dict[int, dict[str, float]]:
    """Microseconds per call of each path at each row count: a warm-up call each (oneDNN builds its kernel for a
    row count on first use), then interleaved rounds until each path has :data:`MIN_ROUNDS` samples and
    :data:`BUDGET_S` was spent (at most :data:`MAX_ROUNDS`), the minimum of each. On one thread the clock is the
    thread's CPU time, which a busy neighbour taking the core away does not inflate; with more it is wall time.
    ``cold``: the cache is emptied before every timed call (a model larger than the cache)."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    evict = _Evictor() if cold else (lambda: None)
    max_rounds = MAX_ROUNDS_COLD if cold else MAX_ROUNDS
    functions = {path: cpu_linear.path_function(weight, path) for path in paths}
    generator = torch.Generator().manual_seed(0)
    timings: dict[int, dict[str, float]] = {}
    with torch.inference_mode():
        for rows in rows_list:
            x = torch.randn(rows, weight.shape[1], generator=generator).to(weight.dtype)
            best = {}
            for path, fn in functions.items():
                start = clock()
                fn(x)
                best[path] = clock() - start
            slow = max(best.values()) >= SLOW_CALL_S
            spent, rounds = 0.0, 0
            while rounds < (1 if slow else MIN_ROUNDS) or (not slow and spent < BUDGET_S and rounds < max_rounds):
                for path in paths[rounds % len(paths) :] + paths[: rounds % len(paths)]:
                    evict()
                    start = clock()
                    functions[path](x)
                    elapsed = clock() - start
                    best[path] = min(best[path], elapsed)
                    spent += elapsed
                rounds += 1
            timings[rows] = {path: round(best[path] * 1e6, 1) for path in paths}
    return timings


def _decide(role: str, weight: torch.Tensor, timings: dict[int, dict[str, float]]) -> MatmulChoice:
    """Each row count's fastest path, kept to as few copies as the timings allow: the path fastest at the most row
    counts (on a tie, the faster overall) is the weight's main one, and another path takes a row count only where
    it is at least :data:`TIE` faster than the main one there."""
    rows = tuple(timings)
    paths = tuple(next(iter(timings.values())))

    def overall(path: str) -> float:  # geometric mean over the row counts: each row count weighs alike
        return math.fsum(math.log(timings[r][path]) for r in rows)

    fastest = {r: min(paths, key=timings[r].__getitem__) for r in rows}
    main = min(paths, key=lambda path: (-sum(fastest[r] == path for r in rows), overall(path)))
    chosen = tuple(fastest[r] if timings[r][fastest[r]] * TIE < timings[r][main] else main for r in rows)
    return MatmulChoice(role, (weight.shape[0], weight.shape[1]), rows, chosen, timings)


def _check(record: dict, weights: dict[str, torch.Tensor], candidates: dict[str, tuple[str, ...]]) -> None:
    for role, weight in weights.items():
        entry = record[role]
        rows = tuple(int(r) for r in entry["rows"])
        if list(entry["shape"]) != list(weight.shape) or len(entry["paths"]) != len(rows) or not rows:
            raise ValueError(f"{role}: shape or rows do not match")
        if not set(entry["paths"]) <= set(candidates[role]):
            raise ValueError(f"{role}: a path this machine does not offer")


def _from_record(record: dict, weights: dict[str, torch.Tensor]) -> dict[str, MatmulChoice]:
    choices = {}
    for role in weights:
        entry = record[role]
        timings = {  # in row order (a JSON object's keys come back as sorted strings: "1", "1024", "16")
            int(rows): {path: float(us) for path, us in cell.items()}
            for rows, cell in sorted(entry["timings_us"].items(), key=lambda item: int(item[0]))
        }
        choices[role] = MatmulChoice(
            role, tuple(entry["shape"]), tuple(int(r) for r in entry["rows"]), tuple(entry["paths"]), timings
        )
    return choices


def _forced(weights: dict[str, torch.Tensor], candidates: dict[str, tuple[str, ...]], name: str) -> MatmulPlan:
    path = FORCED.get(name.lower())
    if path is None:
        raise ValueError(
            f"unknown {FORCE_ENV}={name!r}; choose plain, oneDNN, bf16-weights, bf16-weights-stream, AMX, bf16-dot,"
            " bf16-dot-stream or packed"
        )
    choices = {}
    for role, weight in weights.items():
        offered = candidates[role]
        taken = (
            cpu_linear.default_path(weight)
            if path == "packed"
            else path
            if path in offered
            else (offered[min(1, len(offered) - 1)])
        )
        choices[role] = MatmulChoice(role, (weight.shape[0], weight.shape[1]), (1,), (taken,))
    return MatmulPlan(
        torch.get_num_threads(), next(iter(weights.values())).dtype, choices, f"forced by {FORCE_ENV}={name}"
    )


def measure_plan(weights: dict[str, torch.Tensor], model_bytes: int = 0) -> MatmulPlan:
    """The plan for these weights (role -> the tensor the runner multiplies) at torch's current thread count:
    forced, cached or measured now. A model of ``model_bytes`` larger than the last-level cache is timed with its
    weights out of the cache, as its run reads them."""
    candidates = {role: cpu_linear.candidate_paths(weight) for role, weight in weights.items()}
    forced = env_settings.read(FORCE_ENV)
    if forced:
        return _forced(weights, candidates, forced)
    dtype = next(iter(weights.values())).dtype
    threads = torch.get_num_threads()
    rows = {role: LM_HEAD_ROWS if role == "lm_head" else ROWS for role in weights}
    cold = model_bytes > last_level_cache_bytes()
    descriptor = {
        "cpu": cpu_native.cpu_signature(),
        "torch": torch.__version__,
        "kernels": cpu_native.build_key(),  # a changed C kernel is timed again
        "threads": threads,
        "dtype": _dtype_name(dtype),
        "tie": TIE,
        "cold": cold,
        "rule": DECISION_RULE,
        "weights": {
            role: [list(weight.shape), list(candidates[role]), list(rows[role])] for role, weight in weights.items()
        },
    }

    def measure() -> dict:
        return {
            role: _decide(role, weight, _time_paths(weight, rows[role], candidates[role], cold)).as_dict()
            for role, weight in weights.items()
        }

    result = measured_cache.measured(
        "cpu-matmuls", descriptor, measure, lambda record: _check(record, weights, candidates)
    )
    return MatmulPlan(threads, dtype, _from_record(result.record, weights), result.provenance())


def plan_for(model: object, weights: dict[str, torch.Tensor]) -> MatmulPlan:
    """The plan ``model``'s runners follow: the one made for it at torch's current thread count, else made now (and
    kept on the model, so every runner over it and the pre-flight count agree)."""
    plan = getattr(model, _PLAN_ATTR, None)
    if plan is None or plan.threads != torch.get_num_threads() or set(plan.choices) != set(weights):
        model_bytes = (
            sum(p.numel() * p.element_size() for p in model.parameters()) if hasattr(model, "parameters") else 0
        )
        plan = measure_plan(weights, model_bytes)
        setattr(model, _PLAN_ATTR, plan)
    return plan


def plan_of(model: object) -> MatmulPlan | None:
    """The plan already made for ``model``, if any."""
    return getattr(model, _PLAN_ATTR, None)
