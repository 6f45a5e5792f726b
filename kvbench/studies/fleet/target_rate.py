"""The arrival rate that loads a simulated fleet to a chosen share of its KV blocks, from its capacity.

Routing policies only differ when instances run near full: at a few percent of their blocks every policy ties.
So a simulated fleet without ``--rate`` gets the rate that keeps about :data:`TARGET_USAGE` of every pool in use
while arrivals last, estimated in closed form from the workload and the roofline step times (Little's law):

- a running request holds on average ``h`` blocks over its life (its prompt plus half its answer, in blocks), so
  ``N = usage x blocks / h`` requests run on each instance at that usage;
- ``N`` requests decode one token each per step of ``t(N)`` seconds (the roofline: weights plus ``N`` contexts of
  the mean length read), and every arrival's prefill of ``t_p`` seconds stalls the batch, so an instance finishes
  ``lambda = N / (t(N) x mean output + N x t_p)`` requests per second.

Measured against a bisection on the simulator (``benchmarks/bench_fleet.py``: the rate at which round-robin's mean
block usage over the second half of the arrivals is 85%, Llama-2-13B on an A100-80GB, 4 instances): 37.9 req/s
estimated, 38.7 searched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TARGET_USAGE = 0.85  # the fleet study's load: near saturation, where routing decides (bench_fleet.py)
WAVES = 8  # without --requests, a chosen rate brings this many fleets-full of requests: the pools fill from empty
# over about the lifetime of the longest requests, and the load should then hold for most of the arrivals


@dataclass(frozen=True)
class LoadEstimate:
    rate: float  # arrivals per second for the whole fleet
    running_per_instance: float  # requests in flight on each instance at that load
    usage: float  # the share of each pool's blocks it keeps in use

    def sentence(self, instances: int) -> str:
        fleet = "the instance" if instances == 1 else f"the {instances} instances"
        return (
            f"the rate that keeps about {100 * self.usage:.0f}% of the KV blocks of {fleet} in use while "
            f"arrivals last (about {self.running_per_instance:,.0f} requests in flight on each), estimated from "
            "the workload and the roofline step times"
        )


def blocks_held_sum(prompt: np.ndarray, output: np.ndarray, block_size: int) -> np.ndarray:
    """Per request, the blocks it holds summed over its decode steps: ``sum_k ceil((prompt + k) / bs)`` for k in
    ``1 .. output`` (a paged request grows one block at a time)."""

    def upto(n: np.ndarray) -> np.ndarray:  # sum of ceil(x / bs) for x = 1 .. n
        q, r = np.divmod(n, block_size)
        return block_size * q * (q + 1) // 2 + r * (q + 1)

    return upto(prompt + output) - upto(prompt)


def rate_for_usage(
    pairs: Sequence[tuple[int, int]],
    timing,
    block_size: int,
    num_blocks: int,
    instances: int,
    usage: float = TARGET_USAGE,
) -> LoadEstimate:
    """The fleet arrival rate that keeps ``usage`` of every instance's ``num_blocks`` in use (see the module)."""
    if not pairs:
        raise ValueError("no requests to estimate a load from")
    prompt = np.array([p for p, _ in pairs], dtype=np.int64)
    output = np.maximum(np.array([o for _, o in pairs], dtype=np.int64), 1)
    steps = float(output.sum())
    held = float(blocks_held_sum(prompt, output, block_size).sum()) / steps  # time-weighted over decode steps
    context = float((output * prompt + output * (output - 1) // 2).sum()) / steps
    running = max(1.0, usage * num_blocks / held)
    base, per_token, floor = timing.decode_coefficients(max(1, math.floor(running)))
    step_s = max(floor, base + per_token * running * context)
    prefill_s = float(np.mean([timing.prefill_seconds([int(p)]) for p in prompt[:256]]))
    per_instance = running / (step_s * float(output.mean()) + running * prefill_s)
    return LoadEstimate(instances * per_instance, running, usage)
