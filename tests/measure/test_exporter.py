"""The Prometheus exporter: scraped over real HTTP during a run, values equal the engine's own accounting."""

from __future__ import annotations

import socket
import urllib.request

import pytest
import torch
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import Request, make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.scheduler import Scheduler
from kvbench.engine.step_log import StepLog
from kvbench.errors import KvbenchError
from kvbench.kv.block_pool import BlockPool
from kvbench.kv.paged import PagedManager
from kvbench.measure.exporter import KvMetrics, online_fragmentation, quantile, written_slots
from kvbench.models.hf_model import build_random_model
from kvbench.models.shapes import ModelShape

SHAPE = ModelShape(
    "test-metrics",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    vocab_size=256,
    dtype="fp32",
)
PROMPT_LENS = (5, 17, 9, 12, 3, 8)
MAX_TOKENS = 10


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}} from a real HTTP GET of the endpoint."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode("utf-8")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, engine: str, device: str = "cpu") -> float:
    return samples[name][(("device", device), ("engine", engine))]


@pytest.fixture(scope="module")
def model():
    return build_random_model(SHAPE, seed=0)


def _requests() -> list[Request]:
    generator = torch.Generator().manual_seed(1)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    return [
        make_request(i, torch.randint(0, SHAPE.vocab_size, (n,), generator=generator).tolist(), params)
        for i, n in enumerate(PROMPT_LENS)
    ]


@pytest.mark.parametrize(("engine", "num_blocks"), [("paged", 7), ("contiguous", 12)])
def test_scraped_endpoint_agrees_with_the_engine_at_every_step(model, monkeypatch, engine, num_blocks):
    llm = LLMEngine(model, EngineConfig(engine=engine, block_size=4, num_blocks=num_blocks, max_len=32))
    records = []
    original = StepLog.snapshot

    def capture(self, *args, **kwargs):  # the engine's own per-step accounting
        record = original(self, *args, **kwargs)
        records.append(record)
        return record

    monkeypatch.setattr(StepLog, "snapshot", capture)
    metrics = KvMetrics(device="cpu")
    port = metrics.serve("127.0.0.1", 0)
    assert port > 0 and metrics.url == f"http://127.0.0.1:{port}/metrics"
    llm.alloc_observer = metrics.alloc_observer(engine)
    checked = []
    tokens = {"n": 0}

    def on_step(name, scheduler, finished):
        metrics.observe(name, scheduler)
        samples = scrape(metrics.url)  # a real HTTP client against the live endpoint, mid-run
        pool, record = scheduler.manager.pool, records[-1]
        # the engine's snapshot is taken before the step's finished requests leave; the live state after
        assert value(samples, "kvbench_kv_cache_blocks_used", engine) == pool.num_used <= record.held // 4
        assert value(samples, "kvbench_kv_cache_blocks_free", engine) == pool.num_free
        assert value(samples, "kvbench_kv_cache_blocks_capacity", engine) == pool.num_blocks == num_blocks
        used = sum(written_slots(r) for r in scheduler.running.values())
        assert value(samples, "kvbench_kv_cache_fragmentation", engine) == pytest.approx(
            online_fragmentation(used, pool.num_used * 4)
        )
        assert value(samples, "kvbench_requests_running", engine) == len(scheduler.running) <= len(record.live)
        assert value(samples, "kvbench_requests_waiting", engine) == len(scheduler.waiting)
        assert value(samples, "kvbench_num_preemptions_total", engine) == scheduler.num_preemptions
        assert value(samples, "kvbench_requests_finished_total", engine) == finished
        tokens["n"] = sum(len(r.output_token_ids) for r in requests)
        assert value(samples, "kvbench_generated_tokens_total", engine) == tokens["n"]
        prefilled = sum(r.prompt_len for r in requests if r.output_token_ids and r.parent_id is None)
        assert value(samples, "kvbench_prompt_tokens_total", engine) == prefilled
        count = value(samples, "kvbench_block_alloc_latency_seconds_count", engine)
        assert count == len(metrics._runs[engine].alloc_seconds) and count > 0
        checked.append(record.held)

    requests = _requests()
    try:
        metrics.begin_run(engine)
        result = llm.run(requests, 4, on_step=on_step)
        final = metrics.end_run(engine)
    finally:
        metrics.close()
    assert len(checked) == len(records) > 5 and max(checked) > 0
    assert final["num_preemptions"] == result.num_preemptions
    assert final["generated_tokens"] == tokens["n"] == len(PROMPT_LENS) * MAX_TOKENS
    assert final["requests_finished"] == len(PROMPT_LENS)
    assert final["prompt_tokens"] == sum(PROMPT_LENS)  # once per request, though preempted ones prefill again
    assert final["kv_cache_blocks_used"] == 0 and final["kv_cache_blocks_free"] == num_blocks
    assert final["kv_cache_blocks_used_peak"] * 4 == result.accountant.peak_allocated
    assert final["block_alloc_count"] > 0 and final["block_alloc_latency_p99_seconds"] > 0
    if engine == "paged":
        assert result.num_preemptions > 0  # 7 blocks of 4 slots cannot hold 4 requests: recompute happens


def test_port_in_use_is_a_clear_error_and_the_port_is_freed_on_close():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(KvbenchError, match=rf"metrics port {port} on 127.0.0.1 is already in use"):
            KvMetrics().serve("127.0.0.1", port)
    with KvMetrics() as first:
        port = first.serve("127.0.0.1", 0)
    with KvMetrics() as second:  # closed: the same port binds again
        assert second.serve("127.0.0.1", port) == port
    with pytest.raises(KvbenchError, match="between 0 and 65535"):
        KvMetrics().serve("127.0.0.1", 70000)


def _scheduler_with_work() -> Scheduler:
    scheduler = Scheduler(PagedManager(BlockPool(10, 4)))
    for i, prompt in enumerate((6, 3)):
        scheduler.add(Request(i, prompt, 4, prompt_token_ids=list(range(prompt))))
    scheduler.admit(0)
    for request in scheduler.running.values():
        request.output_token_ids.append(1)  # the prefill samples one token
    return scheduler


def test_textfile_is_written_and_parseable_and_the_global_registry_is_untouched(tmp_path):
    before = {m.name for m in REGISTRY.collect()}
    metrics = KvMetrics(device="cuda:0")
    scheduler = _scheduler_with_work()
    metrics.observe("paged", scheduler)
    path = metrics.write_textfile(tmp_path / "sub" / "metrics.prom")
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert {
        "kvbench_kv_cache_blocks_used",
        "kvbench_kv_cache_blocks_free",
        "kvbench_kv_cache_blocks_capacity",
        "kvbench_kv_cache_fragmentation",
        "kvbench_block_alloc_latency_seconds",
        "kvbench_num_preemptions",
        "kvbench_requests_running",
        "kvbench_requests_waiting",
        "kvbench_generated_tokens",
    } <= set(families)
    used = families["kvbench_kv_cache_blocks_used"].samples[0]
    assert used.labels == {"engine": "paged", "device": "cuda:0"} and used.value == 3  # 2 + 1 blocks of 4
    frag = families["kvbench_kv_cache_fragmentation"].samples[0].value
    assert frag == pytest.approx(1 - 9 / 12)  # 6 + 3 token states in 12 allocated slots
    assert families["kvbench_block_alloc_latency_seconds"].type == "histogram"
    assert not list(tmp_path.glob("sub/.*.tmp"))  # atomic: no temporary left behind
    assert {m.name for m in REGISTRY.collect()} == before
    KvMetrics(device="cuda:0")  # a second exporter: its own registry, no duplicate-name error


def test_allocations_are_timed_only_inside_a_run_and_cost_nothing_when_unset():
    metrics = KvMetrics()
    observer = metrics.alloc_observer("paged")
    observer(0.5)  # before begin_run (a warm-up): not recorded
    metrics.begin_run("paged")
    scheduler = Scheduler(PagedManager(BlockPool(10, 4)))
    scheduler.alloc_observer = observer
    scheduler.add(Request(0, 6, 4))
    scheduler.admit(0)
    values = metrics.end_run("paged")
    assert values["block_alloc_count"] == 1 and values["block_alloc_latency_max_seconds"] < 0.5
    assert values["kv_cache_blocks_used"] is None and values["requests_waiting"] is None  # no step observed
    observer(0.5)  # after end_run: not recorded
    assert metrics.run_values("paged")["block_alloc_count"] == 1
    assert Scheduler.alloc_observer is None  # the default: no timing at all


def test_quantile_and_fragmentation_edges():
    assert quantile([], 0.99) is None
    assert quantile([1.0, 2.0, 3.0], 0.5) == 2.0 and quantile(list(range(1, 101)), 0.99) == 99
    assert online_fragmentation(0, 0) == 0.0 and online_fragmentation(5, 4) == 0.0
    assert online_fragmentation(1, 4) == pytest.approx(0.75)


def test_fleet_metrics_label_each_instance_and_diagnose_reads_them_one_by_one():
    from kvbench.engine.instance import InstanceStats
    from kvbench.measure.exporter import FleetMetrics
    from kvbench.report.diagnose import diagnose_states, load_thresholds, read_states

    def stats(free, preemptions=0, finished=0):
        return InstanceStats(
            time=1.0,
            total_blocks=100,
            free_blocks=free,
            running=3,
            waiting=2,
            waiting_blocks=4,
            preemptions=preemptions,
            finished=finished,
            rejected=0,
            prompt_tokens=10,
            cached_tokens=0,
        )

    metrics = FleetMetrics("paged", "cpu")
    metrics.begin_policy("round-robin")
    metrics.observe_instance(0, stats(80, finished=4))
    metrics.observe_instance(1, stats(5, preemptions=6, finished=2))
    metrics.observe_instance(1, stats(4, preemptions=7, finished=5))
    metrics.observe_fleet(2, 1)
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition())}
    free = {s.labels["instance"]: s.value for s in families["kvbench_kv_cache_blocks_free"].samples}
    assert free == {"0": 80.0, "1": 4.0}
    finished = {
        s.labels["instance"]: s.value
        for s in families["kvbench_requests_finished"].samples
        if s.name.endswith("_total")
    }
    assert finished == {"0": 4.0, "1": 5.0}
    diagnosis = diagnose_states(read_states(metrics.exposition()), load_thresholds(None))
    assert diagnosis.checked == 2
    flagged = [f.source for f in diagnosis.findings if f.rule == "free_blocks"]
    assert len(flagged) == 1 and "instance=1" in flagged[0]
