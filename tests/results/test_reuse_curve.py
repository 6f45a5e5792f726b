"""The reuse study's typed result: summary.json kept key for key, and documents of older runs still read."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvbench.report.reuse_report import curve_spec, reuse_markdown
from kvbench.results.reuse_curve import CurvePoint, ReuseCurve, ReuseDistance, ReuseTrace
from kvbench.results.run_meta import RunMeta
from kvbench.studies.reuse import ReuseSettings, run_reuse_study
from kvbench.workload.prefix_trace import shared_prefix_trace, trace_from_prompts

GiB = 1 << 30


def _study(**settings) -> ReuseCurve:
    trace = shared_prefix_trace(3, 60, 256, 32, 16, 20.0, 0, 16)
    curve = run_reuse_study(trace, ReuseSettings(points=4, **settings))
    return replace(curve, meta=RunMeta.from_json({"command": "kvbench reuse", "simulated": True}))


@pytest.fixture(scope="module")
def plain() -> ReuseCurve:
    return _study()


@pytest.fixture(scope="module")
def tiered() -> ReuseCurve:
    return _study(offload_bytes=64 * GiB, kv_sizes=(GiB,))


@pytest.mark.parametrize("which", ["plain", "tiered"])
def test_summary_json_reads_back_key_for_key(which, request):
    document = request.getfixturevalue(which).to_json()
    text = json.dumps(document, indent=2)
    again = ReuseCurve.from_json(json.loads(text)).to_json()
    assert again == document and json.dumps(again, indent=2) == text
    assert list(document) == [
        "schema_version",
        "kind",
        "meta",
        "trace",
        "deployment",
        "unbounded",
        "deployments",
        "targets",
        "reuse_distance",
        "findings",
        "points",
    ]
    assert document["kind"] == "reuse"


def test_each_part_keeps_the_keys_and_order_summary_json_always_had(plain):
    document = plain.to_json()
    assert list(document["points"][0]) == [
        "engine",
        "concurrency",
        "label",
        "kv_blocks",
        "kv_bytes",
        "hit_rate_pct",
        "share_of_unbounded_pct",
        "hit_tokens",
        "prompt_tokens",
        "prefill_tokens_saved",
        "prefill_s_saved",
        "prefill_time_saved_pct",
        "pinned_blocks_peak",
        "pinned_blocks_mean",
        "pinned_peak_pct",
        "evicted_blocks",
        "requests",
        "refused",
        "queue_wait_mean_s",
    ]
    assert list(document["trace"]) == [
        "source",
        "requests",
        "duration_s",
        "trace_block_size",
        "prompt_tokens",
        "output_tokens",
        "context_tokens",
        "over_context",
        "over_context_prompt_tokens",
    ]
    assert list(document["deployment"]) == [
        "model_name",
        "gpu",
        "block_size",
        "kv_block_bytes",
        "kv_bytes_per_token",
        "max_num_seqs",
        "offload_bytes",
    ]
    assert list(document["unbounded"]) == ["hit_rate_pct", "kv_blocks_peak", "prefill_s_saved"]
    assert list(document["deployments"][0]) == [
        "gpus",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "kv_blocks",
        "kv_bytes",
        "hit_rate_pct",
        "total_hit_rate_pct",
    ]
    assert [list(t) for t in document["targets"]] == [["share_pct", "hit_rate_pct", "kv_bytes"]] * 3
    assert list(document["reuse_distance"])[:2] == ["reuses", "reused_blocks"]
    assert list(document["reuse_distance"]["seconds_histogram"]) == ["edges", "blocks"]


def test_a_point_has_the_cpu_tier_fields_only_with_a_tier(plain, tiered):
    tier_keys = {"offload_bytes", "offload_hit_rate_pct", "total_hit_rate_pct"}
    assert all(not tier_keys & set(p.to_json()) for p in plain.points)
    assert all(
        list(p.to_json())[-3:] == ["offload_bytes", "offload_hit_rate_pct", "total_hit_rate_pct"] for p in tiered.points
    )
    assert all(p.total_hit_rate_pct is not None for p in tiered.points)
    assert plain.asked.total_hit_rate_pct is None and tiered.asked.total_hit_rate_pct is not None
    assert plain.to_json()["deployments"][0]["total_hit_rate_pct"] is None  # written, as null


def test_the_tables_columns_follow_the_tier(plain, tiered):
    assert "with CPU tier" not in [c.heading for c in curve_spec(plain).columns]
    assert "with CPU tier" in [c.heading for c in curve_spec(tiered).columns]
    first = curve_spec(plain).row(plain.points[0])
    assert first[0].endswith("GiB") and first[3].endswith("%")


def test_a_trace_without_reuse_keeps_only_the_count_of_reuses():
    prompts = [(float(i), list(range(100 * i + 20, 100 * i + 84)), 4, None) for i in range(8)]
    curve = run_reuse_study(trace_from_prompts(prompts, 16, "distinct"), ReuseSettings(points=2))
    assert curve.reuse_distance == ReuseDistance(0)
    assert curve.to_json()["reuse_distance"] == {"reuses": 0}
    assert ReuseDistance.from_json({"reuses": 0}).to_json() == {"reuses": 0}
    assert curve.findings == ["No prompt block of this trace repeats an earlier one: no KV size gives a prefix hit."]


def test_a_run_from_before_the_context_was_recorded_still_reads(plain):
    document = plain.to_json()
    for key in ("context_tokens", "over_context", "over_context_prompt_tokens"):
        del document["trace"][key]
    del document["targets"]
    curve = ReuseCurve.from_json(document)
    assert curve.trace == replace(plain.trace, context_tokens=None, over_context=0, over_context_prompt_tokens=0)
    assert curve.targets == []
    assert reuse_markdown(curve) == reuse_markdown(plain)


def test_a_missing_field_is_named():
    with pytest.raises(KeyError, match="prompt_tokens"):
        ReuseTrace.from_json({"source": "x", "requests": 1, "duration_s": 0.0, "trace_block_size": 512})
    with pytest.raises(KeyError, match="hit_rate_pct"):
        CurvePoint.from_json({"engine": "kv-1-blocks", "kv_blocks": 1, "kv_bytes": 1})
