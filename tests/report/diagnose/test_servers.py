"""Reading kvbench, vLLM and SGLang metrics into one shape, from real (vLLM) and documented (SGLang) text."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from kvbench.engine.step_totals import StepTotals
from kvbench.errors import KvbenchError
from kvbench.results import servers
from kvbench.results.exposition import parse_samples
from kvbench.results.servers import ServerState, read_states
from kvbench.results.validity import set_aside_invalid

DATA = Path(__file__).parent / "data"


def vllm_text(name: str) -> str:
    return (DATA / f"vllm_metrics_{name}.txt").read_text()


def test_a_recorded_vllm_server_while_busy():
    (state,) = read_states(vllm_text("busy"))
    assert state.family == "vllm" and state.labels == {"engine": "0", "model_name": "smollm2-135m-instruct-hf"}
    assert state.source == "vLLM engine=0 model_name=smollm2-135m-instruct-hf"
    # cache_config_info: block_size 128, num_gpu_blocks 182, of which one is vLLM's null block
    assert (state.block_size, state.total_blocks) == (128, 181)
    assert state.usage == pytest.approx(8 / 181)  # 8 running requests hold one 128-token block each
    assert state.free_blocks == pytest.approx(173)
    assert (state.running, state.waiting, state.waiting_capacity, state.preemptions) == (8, 0, 0, 0)
    assert state.finished == 1  # the chat request sent before the 8 concurrent ones
    assert (state.prefix_queries, state.prefix_hits, state.hit_rate) == (149, 0, 0.0)
    assert state.config["gpu_memory_utilization"] == "0.92" and state.config["enable_prefix_caching"] == "True"
    assert state.context() == {
        "block_size": 128,
        "gpu_memory_utilization": "0.92",
        "kv_cache_memory_bytes": "1073741824",
        "enable_prefix_caching": "True",
    }


def test_recorded_vllm_server_idle_and_after():
    (idle,) = read_states(vllm_text("idle"))
    assert (idle.usage, idle.running, idle.finished, idle.prefix_queries) == (0, 0, 0, 0)
    assert idle.prompt_tokens_mean is None  # no request finished yet: no mean, not a 0/0
    (after,) = read_states(vllm_text("after"))
    assert (after.usage, after.running, after.finished) == (0, 0, 9)
    assert after.prompt_tokens_mean == pytest.approx(149 / 9) and after.generation_tokens_mean == pytest.approx(520 / 9)
    # the cumulative counters and the TTFT histogram an endpoint point differences over its load
    assert (idle.prompt_tokens, idle.generation_tokens, idle.ttft_count, idle.ttft_sum_s) == (0, 0, 0, 0)
    assert (after.prompt_tokens, after.generation_tokens, after.ttft_count) == (149, 520, 9)
    assert after.ttft_sum_s == pytest.approx(3.9395558834075928)


def documented_vllm_names() -> set[str]:
    names = set()
    for line in (DATA / "vllm_docs_metric_names.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind, _ = line.split("\t")
            names.add(name + "_total" if kind == "counter" else name)
    return names


def test_the_vllm_names_read_are_documented_and_in_the_recorded_text():
    source = inspect.getsource(servers)
    used = {name for name in re.findall(r'"(vllm:[a-z_]+)"', source)}
    used |= {
        f"{name}{suffix}"
        for name in re.findall(r'_mean\(group, "(vllm:[a-z_]+)"\)', source)
        for suffix in ("_sum", "_count")
    }
    legacy = {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"}
    documented = (
        documented_vllm_names()
        | {f"{n}_sum" for n in documented_vllm_names()}
        | {f"{n}_count" for n in documented_vllm_names()}
        | {"vllm:cache_config_info"}
    )
    current = used - legacy - {"vllm:request_prompt_tokens", "vllm:request_generation_tokens"}
    assert current and current <= documented, current - documented
    recorded = {s.name for s in parse_samples(vllm_text("busy"))}
    assert current <= recorded, current - recorded


def test_sglang_from_its_documented_example():
    (state,) = read_states((DATA / "sglang_metrics_docs.txt").read_text())
    assert state.family == "sglang" and state.labels == {"model_name": "meta-llama/Llama-3.1-8B-Instruct"}
    assert (state.usage, state.running, state.waiting) == (0.28, 162, 2826)
    assert state.hit_rate == pytest.approx(0.0075075, rel=1e-4)  # SGLang reports the rate itself
    assert state.preemptions is None and state.total_blocks is None  # not in the documented example
    assert (state.prompt_tokens, state.generation_tokens, state.ttft_count) == (8.128902e6, 7.557572e6, None)


def test_sglang_capacity_page_size_and_retractions_when_exposed():
    text = """# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 3
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 4096
# TYPE sglang:page_size gauge
sglang:page_size{model_name="m",tp_rank="0"} 16
# TYPE sglang:num_retracted_requests counter
sglang:num_retracted_requests_total{model_name="m",tp_rank="0"} 7
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{model_name="m",tp_rank="0",pid="1"} 1
"""
    (state,) = read_states(text)
    assert (state.total_blocks, state.block_size, state.free_blocks) == (256, 16, 128)
    assert state.preemptions == 7  # the cumulative counter, not the per-batch gauge


def test_one_endpoint_with_several_families_and_engines():
    kvbench = """# TYPE kvbench_kv_cache_blocks_capacity gauge
kvbench_kv_cache_blocks_capacity{engine="paged",device="cpu"} 100
kvbench_kv_cache_blocks_free{engine="paged",device="cpu"} 25
kvbench_kv_cache_blocks_capacity{engine="contiguous",device="cpu"} 100
"""
    states = read_states(kvbench + vllm_text("busy"))
    assert [(s.family, s.labels.get("engine")) for s in states] == [
        ("kvbench", "paged"),
        ("kvbench", "contiguous"),
        ("vllm", "0"),
    ]
    assert states[0].usage == 0.75 and states[1].usage is None
    dp = vllm_text("busy") + "\n".join(
        line.replace('engine="0"', 'engine="1"') for line in vllm_text("busy").splitlines() if line.startswith("vllm:")
    )
    assert [s.labels["engine"] for s in read_states(dp)] == ["0", "1"]  # data parallel: one state per engine


STEPS_TEXT = """kvbench_kv_cache_blocks_capacity{engine="paged",device="cpu"} 100
kvbench_engine_steps_total{engine="paged",device="cpu",phase="decode"} 40
kvbench_engine_steps_total{engine="paged",device="cpu",phase="prefill"} 3
kvbench_engine_step_seconds_total{engine="paged",device="cpu",phase="decode"} 0.02
kvbench_engine_step_seconds_total{engine="paged",device="cpu",phase="prefill"} 0.006
kvbench_engine_step_tokens_total{engine="paged",device="cpu",phase="decode"} 120
kvbench_engine_step_tokens_total{engine="paged",device="cpu",phase="prefill"} 900
"""


def test_a_kvbench_servers_step_counters_are_read_by_phase_and_kept_through_a_record():
    (state,) = read_states(STEPS_TEXT)
    assert state.steps == StepTotals(40, 0.02, 120, 3, 0.006, 900)
    assert ServerState.from_record(state.record()) == state
    with pytest.raises(ValueError, match="step totals"):
        ServerState.from_record({**state.record(), "steps": {"decode_steps": 1}})
    partial = "\n".join(line for line in STEPS_TEXT.splitlines() if 'phase="prefill"} 900' not in line)
    assert read_states(partial)[0].steps is None  # a counter missing: no totals rather than a made-up zero


@pytest.mark.parametrize(
    ("value", "why"), [("-1", "decode_tokens is -1: negative (a count)"), ("NaN", "decode_tokens is nan: not a number")]
)
def test_step_counters_outside_their_meaning_are_set_aside_and_named(value, why):
    text = STEPS_TEXT.replace('phase="decode"} 120', f'phase="decode"}} {value}')
    (state,) = read_states(text)
    assert state.steps is None and state.total_blocks == 100
    assert state.invalid["steps"].startswith("kvbench_engine_step*_total: " + why)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!DOCTYPE html><html><body>502 Bad Gateway</body></html>", "HTML page"),
        ("<html>\n<head><title>404 Not Found</title></head></html>", "HTML page"),
        ('{"error": "not found"}', "not Prometheus exposition text"),
        ("hello world\n", "not Prometheus exposition text"),
        ("", "none of the metric families"),
        ('# TYPE python_info gauge\npython_info{version="3.11"} 1\n', "none of the metric families"),
    ],
)
def test_bad_text_is_a_one_line_error(text, message):
    with pytest.raises(KvbenchError, match=message) as err:
        read_states(text, "http://127.0.0.1:1/metrics")
    assert len(str(err.value).splitlines()) == 1


def test_state_records_round_trip_and_refuse_garbage():
    (state,) = read_states(vllm_text("busy"))
    assert ServerState.from_record(state.record()) == state
    record = state.record()
    with pytest.raises(ValueError):
        ServerState.from_record({**record, "family": "tgi"})
    with pytest.raises(ValueError):
        ServerState.from_record({**record, "usage": "high"})


def test_readers_never_name_a_flag():
    """servers.py reads metrics; what to change lives in remedies.py."""
    tree = ast.parse(inspect.getsource(servers))
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not [s for s in strings if re.search(r"(?<![\w-])--[a-z]", s)]


# -- values outside their meaning ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value, why",
    [
        ("usage", 37.5, "outside 0-1 (a share, not a percentage)"),
        ("usage", -0.1, "outside 0-1 (a share, not a percentage)"),
        ("fragmentation", 5.0, "outside 0-1 (a share, not a percentage)"),
        ("running", -3.0, "negative (a count)"),
        ("preemptions", float("inf"), "infinite"),
        ("waiting", float("nan"), "not a number (NaN)"),
        ("waiting", 1e308, "beyond any count a server keeps (2**53)"),
        ("preemptions", 1e300, "beyond any count a server keeps (2**53)"),
    ],
)
def test_a_value_outside_its_meaning_is_set_aside_and_named(field, value, why):
    state = set_aside_invalid(ServerState("kvbench", {"engine": "paged"}, total_blocks=100.0, **{field: value}))
    assert getattr(state, field) is None and state.total_blocks == 100
    assert state.invalid[field].endswith(f" is {value:g}: {why}")


def test_values_that_contradict_each_other_are_set_aside():
    state = set_aside_invalid(
        ServerState("vllm", {}, total_blocks=10.0, used_blocks=11.0, prefix_queries=5.0, prefix_hits=6.0, block_size=0)
    )
    assert (state.used_blocks, state.prefix_hits, state.block_size) == (None, None, None)
    assert state.invalid["prefix_hits"] == "vllm:prefix_cache_hits_total is 6: more than the 5 tokens looked up"
    assert state.invalid["block_size"] == "cache_config_info block_size is 0: not a whole number of tokens"


@pytest.mark.parametrize(
    "buckets, why",
    [
        ([(0.001, float("nan")), (float("inf"), 4.0)], "the bucket le=0.001 counts nan"),
        ([(0.001, 5.0), (float("inf"), 4.0)], "the bucket le=inf counts 4, fewer than the bucket below it (5)"),
        ([(float("nan"), 1.0)], "a bucket bound is NaN"),
    ],
)
def test_histogram_buckets_that_are_not_cumulative_are_set_aside(buckets, why):
    state = set_aside_invalid(ServerState("kvbench", {}, alloc_buckets=buckets))
    assert state.alloc_buckets == [] and state.invalid["alloc_buckets"].endswith(why)


def test_a_vllm_usage_given_as_a_percentage_is_not_read_as_one(vllm_exposition):
    (state,) = read_states(vllm_exposition(usage=37.5))
    assert state.usage is None and state.free_blocks is None
    assert state.invalid == {"usage": "vllm:kv_cache_usage_perc is 37.5: outside 0-1 (a share, not a percentage)"}
    assert state.running == 8  # the rest of the scrape is kept


def test_a_timeline_record_edited_out_of_range_is_set_aside_on_reading():
    record = ServerState("vllm", {"engine": "0"}, usage=0.5, running=2.0).record()
    assert ServerState.from_record(record).invalid == {}
    record["usage"] = 37.5
    again = ServerState.from_record(record)
    assert again.usage is None and "kv_cache_usage_perc is 37.5" in again.invalid["usage"]
    assert ServerState.from_record(again.record()).invalid == again.invalid  # kept through a timeline


def test_label_values_are_printed_escaped():
    state = ServerState("vllm", {"engine": "0\x1b[2J\x07", "model_name": "m\r\nfake line"})
    assert state.label == "engine=0\\x1b[2J\\x07 model_name=m\\r\\nfake line"
    assert "\x1b" not in state.source and "\n" not in state.source
