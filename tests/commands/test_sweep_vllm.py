"""``kvbench sweep --engines paged,contiguous,vllm`` end to end with a stand-in vLLM (conftest ``fake_vllm``), and
the one-line error when vLLM is not installed."""

from __future__ import annotations

import json
import sys

import pytest

from kvbench.cli import main
from kvbench.models.hf_model import build_random_model
from kvbench.models.shapes import ModelShape

SMALL = ModelShape(
    "small",
    num_layers=1,
    hidden_size=32,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=48,
    vocab_size=64,
    max_position_embeddings=128,
    dtype="fp32",
    eos_token_id=3,
)


@pytest.fixture()
def checkpoint(tmp_path):
    path = tmp_path / "small-llama"
    build_random_model(SMALL, seed=0).save_pretrained(path, safe_serialization=True)
    return path


def test_vllm_is_a_reference_column_next_to_kvbenchs_engines(scenario, checkpoint, tmp_path, fake_vllm, capsys):
    fake_vllm.LLM.bytes_per_token = SMALL.bytes_per_token
    out = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--device",
                "cpu",
                "--scenario",
                scenario,
                "--model",
                str(checkpoint),
                "--engines",
                "paged,contiguous,vllm",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "vLLM TPS (reference)" in text and "not a controlled A/B" in text
    summary = json.loads((out / "summary.json").read_text())
    points = {(p["engine"], p["concurrency"]): p for p in summary["points"]}
    assert len(points) == 6
    (llm,) = fake_vllm.built  # built once, kept across points
    assert llm.kwargs["block_size"] == 32  # the scenario's 4, rounded up for vLLM's CPU attention
    assert llm.kwargs["kv_cache_memory_bytes"] == 160 * SMALL.bytes_per_token  # kvbench's pool, in bytes
    for concurrency in (2, 4):
        vllm = points[("vllm", concurrency)]
        assert vllm["status"] == "ok" and vllm["completed"] == 6 and vllm["output_throughput"] > 0
        assert vllm["reference"]["block_size"] == 32 and vllm["kv_usage_source"] == "vLLM scheduler stats"
        assert vllm["peak_running"] <= concurrency and vllm["p50_ttft_ms"] is not None
        row = next(r for r in summary["article_table"] if r["concurrency"] == concurrency)
        assert row["vllm_tps"] == pytest.approx(vllm["output_throughput"]) and row["vllm_status"] == "ok"
        assert row["paged_over_contiguous_tps"] is not None  # the A/B is still paged vs contiguous only
    assert "vLLM TPS (reference)" in (out / "summary.md").read_text()
    assert (out / "timeline-vllm-c4.json").exists() and (out / "throughput.png").exists()


def test_without_vllm_the_error_says_how_to_install_it(scenario, checkpoint, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert (
        main(
            ["sweep", "--device", "cpu", "--scenario", scenario, "--model", str(checkpoint), "--engines", "paged,vllm"]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "pip install vllm" in err and len(err.splitlines()) == 1


def test_vllm_needs_a_checkpoint_and_a_real_run(scenario, fake_vllm, capsys):
    assert main(["sweep", "--scenario", scenario, "--engines", "vllm"]) == 2
    assert "local checkpoint directory" in capsys.readouterr().err
    assert main(["sweep", "--scenario", scenario, "--engines", "paged,vllm", "--simulate"]) == 2
    assert "cannot be simulated" in capsys.readouterr().err
    assert main(["sweep", "--scenario", scenario, "--engines", "paged,tgi"]) == 2
    assert "vllm" in capsys.readouterr().err  # the choices name it
