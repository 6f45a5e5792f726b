"""What a fleet run can be asked for: a limit that cannot be met is refused before anything runs, with why.

A simulated clock is a double: 1e9 s (about 31 years) from 0 it still resolves a tenth of a microsecond,
far below an engine step; much further, step times vanish in rounding and the clock stops moving. A real fleet
replays its arrivals on the wall clock, so their span is how long the run waits. Samples and autoscaling
decisions closer together than an engine step (milliseconds) see nothing new, only cost. Shared prompt
prefixes longer than any prompt can hold cannot be shared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvbench.errors import KvbenchError
from kvbench.preflight import LIMITS

MAX_SIMULATED_S = 1e9  # ~31.7 years of simulated time
MAX_REAL_S = 86_400.0  # a day of wall-clock arrivals
MIN_TICK_S = 1e-3


def _horizon(simulate: bool) -> tuple[float, str]:
    if simulate:
        return MAX_SIMULATED_S, f"a simulated clock covers {MAX_SIMULATED_S:.0e} s (about 31 years)"
    return MAX_REAL_S, "a real fleet replays arrivals on the wall clock, for at most a day (86,400 s)"


def check_rate(rate: float, requests: int, simulate: bool) -> None:
    """A Poisson rate at which ``requests`` arrive within the horizon (before any is drawn)."""
    limit, why = _horizon(simulate)
    if not (math.isfinite(rate) and rate > 0):
        raise KvbenchError(f"the arrival rate must be a positive number of requests per second, got {rate:g}")
    expected = (requests - 1) / rate
    if expected > limit:
        raise KvbenchError(
            f"at {rate:g} req/s, {requests:,} requests take about {expected:.3g} s to arrive; {why}: "
            f"raise the rate to at least {(requests - 1) / limit:.3g} req/s"
        )


def check_arrival_span(times: Sequence[float], simulate: bool, source: str) -> None:
    """Arrival times (from 0) that end within the horizon."""
    if not times:
        return
    limit, why = _horizon(simulate)
    last = times[-1]
    if not math.isfinite(last) or last > limit:
        raise KvbenchError(f"the arrivals ({source}) span {last:.3g} s; {why}")


def check_settings(tick_s: float | None, startup_s: float, prefix_groups: int, prefix_len: int, max_len: int) -> None:
    """The settings known before the requests are: the tick, an added instance's start-up, shared prefixes."""
    if tick_s is not None and not tick_s >= MIN_TICK_S:
        raise KvbenchError(
            f"a tick of {tick_s:g} s is finer than an engine step: samples and autoscaling decisions "
            f"need at least {MIN_TICK_S:g} s between them"
        )
    if not (math.isfinite(startup_s) and 0 <= startup_s <= MAX_SIMULATED_S):
        raise KvbenchError(
            f"an instance start-up of {startup_s:g} s is past what a simulated clock covers ({MAX_SIMULATED_S:.0e} s)"
        )
    if prefix_groups > LIMITS["requests"]:
        raise KvbenchError(
            f"{prefix_groups:,} prefix groups is above kvbench's limit of {LIMITS['requests']:,} "
            "(no run has more requests to share them)"
        )
    if prefix_groups and prefix_len > max_len - 2:
        raise KvbenchError(
            f"a shared prefix of {prefix_len:,} tokens does not fit a prompt: at max-len {max_len:,} a "
            f"prompt holds at most {max_len - 1:,} tokens, one of its own after the prefix, so a "
            f"prefix at most {max_len - 2:,}"
        )
