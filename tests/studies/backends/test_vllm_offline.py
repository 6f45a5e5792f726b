"""vLLM as a sweep backend, tested against a stand-in ``vllm`` module (conftest ``fake_vllm``): the closed loop,
kvbench's timing rules, KV usage from vLLM's stats, and the errors when vLLM cannot run."""

from __future__ import annotations

import sys

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.load_pattern import ClosedLoop, OpenLoop
from kvbench.engine.request import RequestStatus
from kvbench.errors import KvbenchError
from kvbench.results.point import point_from_result
from kvbench.studies.backends.registry import RoutedBackend, choose_backends
from kvbench.studies.backends.vllm_offline import (
    INSTALL_HINT,
    VllmBackend,
    VllmSettings,
    drive,
    vllm_settings,
)
from kvbench.studies.run_options import SweepOptions
from kvbench.studies.run_requests import token_requests
from kvbench.values import ThreadChoice

PAIRS = [(20, 6), (35, 3), (9, 10), (50, 4), (12, 7), (28, 5)]


def requests():
    return token_requests(PAIRS, vocab_size=1000, seed=0)


def build(fake_vllm, block_size=16, blocks=65, max_num_seqs=256, log_stats=True):
    return fake_vllm.LLM(
        block_size=block_size,
        kv_cache_memory_bytes=blocks * block_size,
        max_num_seqs=max_num_seqs,
        disable_log_stats=not log_stats,
    )


class Clock:
    """A clock that moves 10 ms each time it is read: timings are exact, whatever the machine."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.01
        return self.t


def test_closed_loop_keeps_exactly_c_in_flight_and_every_request_finishes(fake_vllm):
    llm = build(fake_vllm)
    engine = llm.llm_engine
    reqs = requests()
    result = drive(fake_vllm, engine, reqs, 2, 64, 16)
    assert engine.max_in_engine == 2  # never more than C submitted and unfinished
    assert engine.added == [f"kvbench-{i}" for i in range(len(PAIRS))]  # the same list, in order
    assert all(r.status is RequestStatus.FINISHED for r in reqs) and len(result.completed) == len(PAIRS)
    assert [r.num_outputs for r in reqs] == [o for _, o in PAIRS]
    assert [len(r.output_token_ids) for r in reqs] == [o for _, o in PAIRS]
    assert result.peak_running == 2 and result.num_preemptions == 0
    assert engine.logger_manager.records > 0  # vLLM's own loggers still get every step's stats


def test_timing_follows_kvbenchs_rules(fake_vllm):
    reqs = requests()
    result = drive(fake_vllm, build(fake_vllm).llm_engine, reqs, 3, 64, 16, clock=Clock())
    for r in reqs:
        assert r.arrival_time <= r.first_token_time <= r.finish_time
        assert len(r.token_times) == r.num_outputs and r.token_times[0] == r.first_token_time
        assert r.token_times[-1] == r.finish_time
    # the first three arrive at the start; each later one when an earlier one finished
    assert [round(r.arrival_time, 6) for r in reqs[:3]] == [round(reqs[0].arrival_time, 6)] * 3
    finishes = sorted(r.finish_time for r in reqs[:3])
    assert reqs[3].arrival_time >= finishes[0]
    assert result.itl_values_s.size == sum(o - 1 for _, o in PAIRS)
    latencies = result.latencies()
    assert latencies["p50_ttft_ms"] > 0 and latencies["p99_e2el_ms"] >= latencies["p50_e2el_ms"]
    throughput = result.throughput()
    assert throughput["output_throughput"] == pytest.approx(sum(o for _, o in PAIRS) / result.elapsed_s)
    # the full-load window, as kvbench's engines report it: from the first token to when the list ran out
    steady = result.steady
    assert steady is not None and steady.start_s == min(r.first_token_time for r in reqs)
    assert steady.end_s in {r.finish_time for r in reqs} and reqs[-1].arrival_time < steady.end_s
    assert 0 < steady.output_tokens < sum(o for _, o in PAIRS)


def test_fewer_requests_than_the_concurrency_have_no_window(fake_vllm):
    assert drive(fake_vllm, build(fake_vllm).llm_engine, requests(), 8, 64, 16, clock=Clock()).steady is None


def test_kv_usage_comes_from_vllms_stats(fake_vllm):
    reqs = requests()
    result = drive(fake_vllm, build(fake_vllm).llm_engine, reqs, 2, 64, 16, clock=Clock())
    point = point_from_result(result, "vllm", 2, "s", bytes_per_token=10)
    assert point.extra["kv_usage_source"] == "vLLM scheduler stats"
    assert point.kv_pool_bytes == 64 * 16 * 10
    waste = point.waste
    assert sum(waste.values()) == pytest.approx(100)
    assert waste["external_pct"] == 0 and waste["reservation_pct"] > 0 and waste["internal_pct"] > 0
    assert 0 < point.fragmentation_mean < 1
    # the peak allocation is what the fake's block pool held: whole 16-token blocks
    assert point.kv_peak_allocated_bytes % (16 * 10) == 0 and point.kv_peak_allocated_bytes > 0
    assert point.status == "ok" and point.completed == len(PAIRS)


def test_one_request_is_accounted_exactly_with_hindsight(fake_vllm):
    """20 prompt tokens, 6 outputs, 16-token blocks: after n tokens it has written 19 + n states in 2 blocks
    (32 slots) and will write 25 in all; so reserved = 25 - (19 + n) and internal = 32 - 25 = 7."""
    (request,) = token_requests([(20, 6)], 1000, 0)
    result = drive(fake_vllm, build(fake_vllm).llm_engine, [request], 1, 64, 16, clock=Clock())
    acct = result.accountant
    assert acct.peak.used == 24 and acct.peak.reserved == 5 and acct.peak.internal == 7
    assert acct.peak_allocated == 32 and acct.steps == 6  # five steps running, the last one drained
    assert request.final_kv_len == 25


def test_without_vllms_stats_the_blocks_are_counted_by_kvbench(fake_vllm):
    reqs = requests()
    result = drive(fake_vllm, build(fake_vllm, log_stats=False).llm_engine, reqs, 2, 64, 16)
    assert result.extras["point"]["kv_usage_source"].startswith("kvbench's count")
    assert result.accountant.peak_allocated % 16 == 0 and result.accountant.peak_allocated > 0


def settings(**changes) -> VllmSettings:
    base = dict(
        model="m",
        dtype="float32",
        device="cpu",
        block_size=32,
        kv_cache_bytes=64 * 32,
        max_model_len=128,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        seed=0,
    )
    return VllmSettings(**{**base, **changes})


def test_backend_builds_once_warms_up_uncounted_and_reports_itself(fake_vllm):
    backend = VllmBackend(
        settings(), EngineConfig(block_size=32, num_blocks=64), 1, build=lambda s: fake_vllm.LLM(**s.llm_kwargs())
    )
    backend.warm_up("vllm", token_requests([(4, 2), (5, 2)], 1000, 1))
    steps = []
    reqs = requests()
    result, memory = backend.run(
        "vllm", reqs, ClosedLoop(4), lambda engine, scheduler, finished: steps.append(finished)
    )
    assert len(fake_vllm.built) == 1 and memory == {}
    llm = fake_vllm.built[0]
    assert llm.kwargs["enable_prefix_caching"] is False and llm.kwargs["disable_log_stats"] is False
    assert llm.kwargs["enforce_eager"] is True and llm.kwargs["kv_cache_memory_bytes"] == 64 * 32
    assert len(result.requests) == len(PAIRS)  # the warm-up requests are not in the run
    assert steps[-1] == len(PAIRS) and steps == sorted(steps)
    reference = result.extras["point"]["reference"]
    assert reference["version"] == "0.0-fake" and reference["block_size"] == 32 and reference["num_blocks"] == 63
    assert "not a controlled A/B" in reference["note"]


def test_routed_backend_sends_each_engine_to_its_own(fake_vllm):
    chosen = ThreadChoice(2, "set by the user")

    class Own:
        base, bytes_per_token, loaded, dtype_name, threads = EngineConfig(), 8, "model", "fp32", chosen

        def __init__(self):
            self.ran = []
            self.closed = 0

        def warm_up(self, engine, requests):
            self.ran.append(("warm", engine))

        def run(self, engine, requests, load, on_step):
            self.ran.append(("run", engine))
            return "result", {}

        def close(self):
            self.closed += 1

    own = Own()
    external = VllmBackend(settings(), EngineConfig(), 1, build=lambda s: fake_vllm.LLM(**s.llm_kwargs()))
    routed = RoutedBackend(own, {"paged": own, "vllm": external})
    assert routed.run("paged", [], ClosedLoop(1), None) == ("result", {})
    assert (routed.loaded, routed.dtype_name, routed.threads) == ("model", "fp32", chosen)  # the provider's
    result, _ = routed.run("vllm", requests(), ClosedLoop(2), None)
    assert len(result.completed) == len(PAIRS) and own.ran == [("run", "paged")]
    assert not routed.can_fork("vllm")
    routed.close()
    assert own.closed == 1 and external._llm is None  # each backend closed once


def test_settings_follow_the_sweep(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    base = EngineConfig(block_size=16, num_blocks=100, max_len=512, max_num_seqs=300, max_prefill_tokens=4096)
    cpu = vllm_settings(str(tmp_path), "fp32", "cpu", base, bytes_per_token=100, seed=3)
    assert (cpu.block_size, cpu.dtype, cpu.kv_cache_bytes) == (32, "float32", 1600 * 100)  # CPU: multiples of 32
    assert (cpu.max_model_len, cpu.max_num_seqs, cpu.max_num_batched_tokens, cpu.seed) == (512, 300, 4096, 3)
    gpu = vllm_settings(str(tmp_path), "fp16", "cuda", base, bytes_per_token=100, seed=3)
    assert (gpu.block_size, gpu.dtype) == (16, "float16") and "enforce_eager" not in gpu.llm_kwargs()
    with pytest.raises(KvbenchError, match="local checkpoint directory"):
        vllm_settings("tiny", "fp32", "cpu", base, 100, 0)


def test_vllm_missing_simulated_or_a_preset_is_refused(tmp_path, monkeypatch, fake_vllm):
    (tmp_path / "config.json").write_text("{}")
    run = choose_backends(SweepOptions(engines=("paged", "vllm"), model=str(tmp_path)))  # all fine
    assert run.by_engine["vllm"].name == "vllm" and run.by_engine["paged"].name == "kvbench"
    with pytest.raises(KvbenchError, match="the vLLM column runs a real model on this machine; it cannot be simulated"):
        choose_backends(SweepOptions(engines=("vllm",), model=str(tmp_path), simulate=True))
    with pytest.raises(KvbenchError, match="local checkpoint directory"):
        choose_backends(SweepOptions(engines=("vllm",), model="tiny"))
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(KvbenchError) as err:
        choose_backends(SweepOptions(engines=("vllm",), model=str(tmp_path)))
    assert str(err.value) == INSTALL_HINT and "pip install vllm" in INSTALL_HINT


def test_a_run_never_keeps_the_stats_hook(fake_vllm):
    engine = build(fake_vllm).llm_engine
    original = engine.logger_manager.record
    drive(fake_vllm, engine, requests(), 2, 64, 16)
    assert engine.logger_manager.record == original


def test_a_request_vllm_aborts_fails_the_run_instead_of_counting_as_done(fake_vllm):
    engine = build(fake_vllm).llm_engine
    step = engine.step

    def aborting():
        outputs = step()
        for output in outputs:
            if output.request_id == "kvbench-2" and output.finished:
                output.outputs[0].finish_reason = "abort"
        return outputs

    engine.step = aborting
    with pytest.raises(RuntimeError, match="vLLM ended request 2 with 'abort'"):
        drive(fake_vllm, engine, requests(), 2, 64, 16)
    lost = build(fake_vllm).llm_engine
    lost.step, lost.has_unfinished_requests = (lambda: []), (lambda: False)  # the engine lost the requests
    with pytest.raises(RuntimeError, match="no unfinished request"):
        drive(fake_vllm, lost, requests()[:1], 1, 64, 16)


def test_an_open_loop_sends_each_request_at_its_arrival_time(fake_vllm):
    """The same client loop runs an open loop: requests sent on schedule, idle gaps waited out, no window."""
    reqs = requests()
    times = (0.0, 0.0, 0.05, 0.3, 0.31, 0.6)
    result = drive(fake_vllm, build(fake_vllm).llm_engine, reqs, OpenLoop(times), 64, 16, clock=Clock())
    assert [r.arrival_time for r in reqs] == list(times)
    assert all(r.status is RequestStatus.FINISHED and r.first_token_time >= r.arrival_time for r in reqs)
    assert len(result.completed) == len(PAIRS) and result.steady is None
    capped = requests()
    drive(fake_vllm, build(fake_vllm).llm_engine, capped, OpenLoop(times, max_concurrency=1), 64, 16, clock=Clock())
    for before, after in zip(capped, capped[1:], strict=False):  # one in flight: each sent once the last one ended
        assert after.arrival_time >= before.finish_time
