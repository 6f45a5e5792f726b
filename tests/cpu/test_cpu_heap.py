"""The CPU heap policy: a freed large block is reused, not faulted in afresh (counted in page faults, not time)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from kvbench.cpu import cpu_heap

# In a fresh process: optionally apply the policy, then allocate, touch and free a 64 MiB tensor round after round
# (what prefill steps do with each activation), and count each round's minor page faults.
_ROUNDS = """
import json, resource, sys
import torch
from kvbench.cpu import cpu_heap
policy = cpu_heap.keep_freed_memory() if sys.argv[1] == "apply" else None
ROUNDS = int(sys.argv[2])
faults = []
for _ in range(ROUNDS):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.empty(16 * 1024 * 1024)
    block.fill_(1.0)
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
kept, reason = (policy.kept, policy.reason) if policy else (None, "")
print(json.dumps({"kept": kept, "reason": reason, "faults": faults}))
"""

# glibc 2.36 asks for size + 2 MiB for a 2 MiB-aligned block, so a freed block fits the next request only once it
# has merged with a neighbour; until then (0-12 rounds in 30 tries, by where small allocations land) the heap grows
ROUNDS, SETTLED = 32, 4


def _rounds(apply: bool, env: dict[str, str] | None = None) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _ROUNDS, "apply" if apply else "leave", str(ROUNDS)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, cpu_heap.THP_ENV: "1", **(env or {})},  # kvbench's default, whatever this shell has
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy acts on glibc's malloc")


@glibc_only
def test_a_kept_heap_reuses_a_freed_large_block_without_faulting_it_in_again() -> None:
    untouched = _rounds(apply=False)
    kept = _rounds(apply=True)
    # as malloc does: each 64 MiB block is its own mmap, so every round faults its pages in again (huge pages: ~550)
    first, *later = untouched["faults"]
    assert first > 30 and all(f >= first / 2 for f in later), untouched
    assert kept["kept"] is True and "glibc" in kept["reason"]
    first, settled = kept["faults"][0], kept["faults"][-SETTLED:]
    assert first > 30 and all(f <= first / 20 for f in settled), kept  # once the heap has grown, it is reused


@glibc_only
@pytest.mark.parametrize(("env", "why"), [({cpu_heap.ENV: "0"}, cpu_heap.ENV), ({cpu_heap.THP_ENV: "0"}, "THP")])
def test_malloc_is_left_as_it_is_when_asked_or_when_it_would_not_help(env: dict[str, str], why: str) -> None:
    left = _rounds(apply=True, env=env)
    assert left["kept"] is False and why in left["reason"]
    first, *later = left["faults"]
    assert first > 30 and all(f >= first / 2 for f in later), left


def test_the_policy_describes_itself() -> None:
    assert "kept" in cpu_heap.HeapPolicy(True, "glibc").describe()
    assert "as malloc does (not glibc (musl))" in cpu_heap.HeapPolicy(False, "not glibc (musl)").describe()


def test_a_cpu_runner_applies_the_policy_once_per_process() -> None:
    from kvbench.models.hf_model import build_random_model
    from kvbench.models.runner import ModelRunner
    from kvbench.models.shapes import MODEL_PRESETS

    runner = ModelRunner(build_random_model(MODEL_PRESETS["tiny"], seed=0), num_blocks=4, block_size=16)
    assert runner.heap_policy is cpu_heap.current() is cpu_heap.keep_freed_memory()
