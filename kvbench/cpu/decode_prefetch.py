"""How far ahead, and into which cache, the C decode attention prefetches K/V rows: measured on this CPU.

A decode step reads every running context's K and V rows block by block through its block table; the blocks lie
anywhere in the pool, where the hardware prefetcher, which follows streams, cannot guess the next one, so the
kernel prefetches the rows some tokens ahead itself. What pays differs by CPU (docs/CPU_RESULTS.md, "Why the CPU
choices are measured"), so the choice is made by timing the kernel at start-up on a pool of the model's KV shape
(query and KV heads, head_dim, block size, dtype), twice the size of the last-level cache so that every call reads
it from memory as a long decode does, with the blocks scattered as a pool's are once requests have come and gone.
Each candidate runs in interleaved rounds (the minimum of each counts); one other than the previous fixed setting
must be :data:`TIE` faster to be taken. The choice is cached per machine and shape
(:mod:`kvbench.cpu.measured_cache`) and printed with its timings; ``KVBENCH_DECODE_PREFETCH=off|16:L1|32:L2`` (any
distance) forces one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from kvbench import env_settings
from kvbench.cpu import measured_cache
from kvbench.cpu.cpu_choices import last_level_cache_bytes
from kvbench.errors import KvbenchError
from kvbench.kernels import cpu_native
from kvbench.kernels.cpu_native import DEFAULT_PREFETCH, MAX_PREFETCH_AHEAD, DecodePrefetch

ENV = "KVBENCH_DECODE_PREFETCH"
CANDIDATES = (
    DecodePrefetch(0, 1),
    DEFAULT_PREFETCH,
    DecodePrefetch(32, 1),
    DecodePrefetch(16, 2),
    DecodePrefetch(32, 2),
)
ROUNDS = 3  # interleaved; each call reads the whole probe pool from memory
CONTEXT = 256  # tokens per request of the probe
MAX_POOL_BYTES = 512 << 20
TIE = 1.05
_CHOICES_ATTR = "_kvbench_decode_prefetch"  # on the model: (block size, dtype) -> the choice its runners follow


@dataclass(frozen=True)
class PrefetchChoice:
    """The prefetch the runner's decode attention uses, and why."""

    prefetch: DecodePrefetch
    reason: str
    timings_us: dict[str, float] = field(default_factory=dict)  # candidate -> microseconds per call

    def line(self) -> str:
        return f"decode attention prefetch: {self.prefetch.describe()} ({self.reason})"

    def as_dict(self) -> dict:
        return {
            "ahead": self.prefetch.ahead,
            "level": self.prefetch.level,
            "reason": self.reason,
            "timings_us": self.timings_us,
        }


def parse(text: str) -> DecodePrefetch:
    """``off`` or ``TOKENS:L1`` / ``TOKENS:L2``; a one-line ``KvbenchError`` otherwise (the text is the user's)."""
    value = text.strip().lower()
    if value == "off":
        return DecodePrefetch(0, 1)
    ahead, _, level = value.partition(":")
    if not (ahead.isascii() and ahead.isdigit()) or level not in ("l1", "l2") or int(ahead) > MAX_PREFETCH_AHEAD:
        raise KvbenchError(
            f"{ENV}={text!r}: say off, or 0 to {MAX_PREFETCH_AHEAD} tokens ahead and a cache level, e.g. 16:L1 or 32:L2"
        )
    return DecodePrefetch(int(ahead), int(level[1]))


def _key(prefetch: DecodePrefetch) -> str:
    return f"{prefetch.ahead}:L{prefetch.level}"


def _probe(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """A query batch, K and V pools of twice the last-level cache (at most :data:`MAX_POOL_BYTES`) and block
    tables whose blocks are scattered over the pool."""
    token_bytes = num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    pool_bytes = min(2 * last_level_cache_bytes(), MAX_POOL_BYTES) // 2  # each of K and V
    per_request = -(-CONTEXT // block_size)
    batch = max(1, pool_bytes // (token_bytes * block_size * per_request))
    num_blocks = batch * per_request
    generator = torch.Generator().manual_seed(0)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.empty(shape, dtype=dtype).uniform_(-1, 1, generator=generator)
    v_cache = torch.empty(shape, dtype=dtype).uniform_(-1, 1, generator=generator)
    tables = torch.randperm(num_blocks, generator=generator).to(torch.int32).view(batch, per_request)
    lens = torch.full((batch,), CONTEXT, dtype=torch.int32)
    query = torch.randn(batch, num_heads, head_dim, generator=generator).to(dtype)
    return query, k_cache, v_cache, tables, lens


def _measure(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> dict:
    query, k_cache, v_cache, tables, lens = _probe(num_heads, num_kv_heads, head_dim, block_size, dtype)
    out = torch.empty_like(query)
    scale = head_dim**-0.5

    def call(prefetch: DecodePrefetch) -> float:
        start = time.thread_time()  # the kernel runs on this thread; a neighbour taking the core does not count
        cpu_native.paged_decode_attention(query, k_cache, v_cache, tables, lens, scale, out, CONTEXT, prefetch)
        return time.thread_time() - start

    for prefetch in CANDIDATES:  # warm-up: the pages are in use and the last filled rows out of the cache
        call(prefetch)
    best = {_key(p): float("inf") for p in CANDIDATES}
    for round_index in range(ROUNDS):
        order = CANDIDATES[round_index % len(CANDIDATES) :] + CANDIDATES[: round_index % len(CANDIDATES)]
        for prefetch in order:
            best[_key(prefetch)] = min(best[_key(prefetch)], call(prefetch))
    return {"timings_us": {key: round(seconds * 1e6, 1) for key, seconds in best.items()}}


def _decide(timings: dict[str, float]) -> DecodePrefetch:
    chosen = DEFAULT_PREFETCH
    for prefetch in CANDIDATES:
        if timings[_key(prefetch)] * TIE < timings[_key(chosen)]:
            chosen = prefetch
    return chosen


def choose(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> PrefetchChoice:
    """The decode attention's prefetch for this KV shape on this CPU: forced by :data:`ENV`, cached or measured."""
    forced = env_settings.read(ENV)
    if forced:
        return PrefetchChoice(parse(forced), f"set by {ENV}")
    pool_bytes = min(2 * last_level_cache_bytes(), MAX_POOL_BYTES)
    descriptor = {
        "cpu": cpu_native.cpu_signature(),
        "kernels": cpu_native.build_key(),
        "shape": [num_heads, num_kv_heads, head_dim, block_size],
        "dtype": str(dtype),
        "candidates": [_key(p) for p in CANDIDATES],
        "context": CONTEXT,
        "pool_bytes": pool_bytes,
        "tie": TIE,
    }

    def check(record: dict) -> None:
        if sorted(record["timings_us"]) != sorted(_key(p) for p in CANDIDATES):
            raise ValueError("other candidates")
        if not all(float(us) > 0 for us in record["timings_us"].values()):
            raise ValueError("a timing that is not positive")

    result = measured_cache.measured(
        "cpu-decode-prefetch",
        descriptor,
        lambda: _measure(num_heads, num_kv_heads, head_dim, block_size, dtype),
        check,
    )
    timings = {key: float(us) for key, us in result.record["timings_us"].items()}
    listed = ", ".join(f"{'off' if p.ahead == 0 else _key(p)} {timings[_key(p)]:.0f} us" for p in CANDIDATES)
    reason = (
        f"measured over a {pool_bytes >> 20} MiB pool of {CONTEXT}-token contexts, best of "
        f"{ROUNDS}: {listed}; {result.provenance()}"
    )
    return PrefetchChoice(_decide(timings), reason, timings)


def choice_for(model: object, block_size: int, dtype: torch.dtype) -> PrefetchChoice:
    """The choice ``model``'s runners of this block size and KV dtype follow: made once per model (kept on it, so
    the run's printed line and every engine over the model agree)."""
    config = model.config  # type: ignore[attr-defined]
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    choices = getattr(model, _CHOICES_ATTR, None)
    if choices is None:
        choices = {}
        setattr(model, _CHOICES_ATTR, choices)
    key = (block_size, str(dtype))
    if key not in choices:
        choices[key] = choose(num_heads, config.num_key_value_heads, head_dim, block_size, dtype)
    return choices[key]


def applies(device: torch.device, kernel_backend: str, dtype: torch.dtype) -> bool:
    """Whether the runner's decode attention is the C kernel, the one that prefetches."""
    return device.type == "cpu" and kernel_backend == "native" and dtype in cpu_native.KERNEL_DTYPES
