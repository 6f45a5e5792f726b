"""How many CPU threads the model's matmuls use: decided by measuring them, not by a rule of thumb.

On a shared machine a thread hand-off can wait for a time slice another process holds, so more threads can be
slower (docs/CPU_RESULTS.md, "Why the CPU choices are measured"). ``auto`` times the model's own decode-sized
matmul with each candidate thread count, interleaved, and keeps the fastest (fewer threads on a tie): the median
of its rounds, not the best, since a hand-off that often waits makes a run slow even if it sometimes does not.
Given the model's matmul as the engine will run it (``cpu_linear.probe_linear``: oneDNN-packed, or the AMX
kernel, whose threads share the columns their own way), that is what is timed, at the model's dtype. With
``cache=True`` the timings are kept per machine and model shape (:mod:`kvbench.cpu.measured_cache`) and a later
run reuses them; the reason printed says which.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvbench import env_settings
from kvbench.cpu import measured_cache
from kvbench.kernels.cpu_native import cpu_signature
from kvbench.values import ThreadChoice, parse_threads

ROUNDS = 7  # interleaved rounds per candidate; the median of each is compared (what a run will mostly see)
TIE = 1.05  # more threads must be at least this much faster to be chosen


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


ENV = "KVBENCH_THREADS"  # a default for ``auto`` (the tests pin one thread with it)


Probe = Callable[[], tuple[Callable[[torch.Tensor], torch.Tensor], str]]


def choose_threads(
    hidden: int,
    intermediate: int,
    requested: int | None = None,
    batch: int = 16,
    probe: Probe | None = None,
    dtype: torch.dtype = torch.float32,
    cache: bool = False,
) -> ThreadChoice:
    """The thread count for a CPU model of this width; ``requested`` wins when given, then ``KVBENCH_THREADS``.

    ``probe``, called only when there is something to measure, returns the model's own gate/up-sized matmul as
    the engine runs it and that path's name (for the reason); without it a random ``[2 x intermediate, hidden]``
    weight goes through ``F.linear``. Activations are of ``dtype``, the model's."""
    if requested is None and (given := env_settings.read(ENV)):
        requested = parse_threads(given)
        if requested is not None:
            torch.set_num_threads(requested)
            return ThreadChoice(requested, f"set by {ENV}")
    if requested is not None:
        torch.set_num_threads(requested)
        return ThreadChoice(requested, "set by the user")
    cores = available_cores()
    candidates = sorted({1, cores})
    if len(candidates) == 1:
        torch.set_num_threads(1)
        return ThreadChoice(1, "one core available")
    x = torch.randn(batch, hidden).to(dtype)
    if probe is not None:
        linear, path = probe()
    else:
        weight = torch.randn(2 * intermediate, hidden).to(dtype)
        linear, path = (lambda rows: F.linear(rows, weight)), "plain"

    def measure() -> dict:
        samples: dict[int, list[float]] = {threads: [] for threads in candidates}
        with torch.inference_mode():
            for _ in range(ROUNDS):
                for threads in candidates:
                    torch.set_num_threads(threads)
                    linear(x)  # one untimed call: the pool of threads is up
                    start = time.perf_counter()
                    linear(x)
                    samples[threads].append(time.perf_counter() - start)
        return {
            "timings_us": {str(threads): round(statistics.median(times) * 1e6, 1) for threads, times in samples.items()}
        }

    provenance = ""
    if cache:
        descriptor = {
            "cpu": cpu_signature(),
            "torch": torch.__version__,
            "candidates": candidates,
            "batch": batch,
            "hidden": hidden,
            "intermediate": intermediate,
            "dtype": str(dtype),
            "path": path,
        }

        def check(record: dict) -> None:
            if sorted(int(t) for t in record["timings_us"]) != candidates:
                raise ValueError("other thread counts")

        result = measured_cache.measured("cpu-threads", descriptor, measure, check)
        record, provenance = result.record, f"; {result.provenance()}"
    else:
        record = measure()
    best = {int(threads): us for threads, us in record["timings_us"].items()}
    chosen = min(candidates)
    for threads in candidates:
        if best[threads] * TIE < best[chosen]:
            chosen = threads
    torch.set_num_threads(chosen)
    timings = ", ".join(f"{t} thread(s) {best[t]:.0f} us" for t in candidates)
    return ThreadChoice(
        chosen,
        f"measured the model's {path} [{batch} x {hidden}] decode matmul, median of {ROUNDS}: {timings}{provenance}",
    )
