"""The step log's hindsight accounting: the per-block path of runs with forks agrees with the per-request path
when nothing is shared, also when requests end (EOS) before the max_tokens they were admitted for."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request
from kvbench.engine.scheduler import Scheduler
from kvbench.engine.step_log import StepLog
from kvbench.kv.accounting import PARTS


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 9), st.integers(2, 12), st.integers(1, 12)), min_size=1, max_size=6),
    st.sampled_from([1, 2, 4]),
)
def test_block_path_equals_request_path_without_sharing(specs, block_size):
    config = EngineConfig(block_size=block_size, num_blocks=256, max_len=64)
    scheduler = Scheduler(config.build_manager(), config)
    requests = [Request(i, prompt, max_tokens) for i, (prompt, max_tokens, _) in enumerate(specs)]
    for request in requests:
        assert scheduler.add(request)
    scheduler.admit(0)
    shared, plain = StepLog(config.pool_slots, block_size), StepLog(config.pool_slots, block_size)
    ends = {r.request_id: min(eos, r.max_tokens) for r, (_, _, eos) in zip(requests, specs, strict=True)}
    clock = 0
    while scheduler.running:
        for log, forked in ((shared, True), (plain, False)):
            log.snapshot(scheduler, clock, forked).seconds = 1.0
        for request in list(scheduler.running.values()):
            if request.outputs(clock) >= ends[request.request_id]:
                scheduler.finish(request, clock)  # EOS: shorter than planned
        for request in list(scheduler.running.values()):
            if scheduler.needs_room(request, clock):
                scheduler.make_room(request, clock)
        clock += 1
    assert all(r.final_kv_len == r.prompt_len + ends[r.request_id] - 1 for r in requests)
    a, b = shared.accountant(requests), plain.accountant(requests)
    for part in PARTS:
        assert a.slot_seconds.as_dict()[part] == pytest.approx(b.slot_seconds.as_dict()[part]), part
    assert a.peak == b.peak and a.peak_needed == b.peak_needed
