"""The sections every kind shares: provenance of a GPU run, the memory waterfall, the findings' summary."""

from __future__ import annotations

from kvbench.report.diagnose import Thresholds, diagnose_points
from kvbench.report.html.common import findings_section, provenance_facts, waterfall_section
from kvbench.report.html.page import Figure, Findings, Table
from kvbench.report.waterfall import waterfall_levels
from kvbench.results.run_meta import RunMeta

GPU_META = {
    "command": "kvbench sweep --device cuda",
    "created_utc": "2026-01-01T00:00:00+00:00",
    "kvbench_version": "0.1.0",
    "git_revision": None,
    "model_name": "llama-2-7b",
    "device": "cuda:0",
    "model_shape": {
        "architecture": "llama",
        "num_layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "num_kv_heads": 32,
        "head_dim": 128,
        "dtype": "fp16",
        "bytes_per_token": 524288,
        "num_parameters": 6_738_415_616,
    },
    "host": {
        "cpu": "Some CPU",
        "cores": 16,
        "memory_bytes": 128 * 2**30,
        "machine": "x86_64",
        "gpu": {
            "name": "NVIDIA H200",
            "memory_bytes": 141 * 10**9,
            "count": 1,
            "cuda": "12.8",
            "driver": "570.86.15",
        },
    },
    "threads": None,
    "packages": {"torch": "2.13.0", "numpy": "2.3.0"},
    "scenario": "article",
    "seed": 0,
    "budget_source": "0.9 of free memory",
}


def test_provenance_of_a_gpu_run():
    facts = {f.label: f.value for f in provenance_facts(GPU_META)}
    assert facts["GPU and driver"] == "NVIDIA H200, 131.32 GiB; NVIDIA driver 570.86.15, CUDA 12.8 (torch build)"
    assert facts["model shape"] == (
        "llama, 32 layers, hidden 4,096, 32 heads (32 KV heads) × 128, 6.74 B "
        "parameters, fp16: 512.00 KiB of KV per token"
    )
    assert facts["git commit"] == "not recorded (not a git checkout)"
    assert facts["host"] == "Some CPU, 16 usable cores, 128.00 GiB memory, x86_64"
    assert facts["packages"] == "torch 2.13.0, numpy 2.3.0"
    assert facts["scenario"] == "article" and facts["budget source"] == "0.9 of free memory"  # other settings
    assert "threads" not in {k.lower() for k in facts} and "CPU threads" not in facts


def test_provenance_of_a_file_whose_values_are_of_the_wrong_kind_shows_them_as_not_recorded():
    """Another tool's summary.json: a GPU recorded as text, a count of null, threads as a list."""
    odd = {
        **GPU_META,
        "host": {"cpu": "Some CPU", "cores": "many", "gpu": {"name": "X", "count": None}},
        "threads": [4],
        "packages": ["torch"],
    }
    facts = {f.label: f.value for f in provenance_facts(odd)}
    assert facts["GPU and driver"] == "X; NVIDIA driver unknown" and facts["host"] == "Some CPU"
    assert "CPU threads" not in facts and "packages" not in facts
    facts = {f.label: f.value for f in provenance_facts({**odd, "host": {"gpu": "H200"}})}
    assert facts["GPU and driver"] == "none used by this run"


def test_the_waterfall_of_each_point_is_a_table_beside_its_plot():
    point = {
        "engine": "paged",
        "concurrency": 8,
        "kv_pool_bytes": 1000,
        "kv_peak_allocated_bytes": 600,
        "kv_peak_used_bytes": 500,
        "memory": {"rss_peak_bytes": 5000},
    }
    point["waterfall"] = [level.to_json() for level in waterfall_levels(point)]
    section = waterfall_section([point, {"engine": "x", "concurrency": 1, "status": "error"}], {})
    (sub,) = section.subsections
    assert sub.title == "paged C=8" and sub.layout == "pair"
    (table,) = [b for b in sub.blocks if isinstance(b, Table)]
    assert [row[0].text for row in table.rows] == ["process RSS", "KV pool", "KV allocated", "token states"]
    assert [row[3].text for row in table.rows] == ["3.91 KiB", "400 B", "100 B", "–"]
    assert not any(isinstance(b, Figure) for b in sub.blocks)  # no plot was drawn for it
    assert waterfall_section([{"engine": "x", "concurrency": 1}], {}) is None


def test_findings_summary_counts_by_severity():
    points = [
        {
            "engine": "contiguous",
            "concurrency": 4,
            "status": "oom",
            "peak_running": 2,
            "completed": 2,
            "rejected": 2,
            "fragmentation_mean": 0.5,
        }
    ]
    block = findings_section(diagnose_points(points, RunMeta(), Thresholds())).blocks[0]
    assert isinstance(block, Findings)
    assert block.summary == "1 critical, 1 warning in 1 point(s)."
    assert [i.rule for i in block.items] == ["concurrency_capped", "fragmentation"]
    empty = findings_section(diagnose_points([], RunMeta(), Thresholds())).blocks[0]
    assert empty.summary == "No finding in 0 point(s): every rule passed."
