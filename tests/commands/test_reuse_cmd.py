"""kvbench reuse end to end (the shipped trace, a synthetic workload, a requests file) and its bad input."""

from __future__ import annotations

import json

import pytest

from kvbench.cli import main
from kvbench.report.html import write_report

QUICK = ["--max-requests", "200", "--points", "6"]


def run_json(args: list[str], capsys) -> dict:
    assert main(["reuse", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_default_trace_gives_a_curve_a_page_and_its_files(tmp_path, capsys):
    out = tmp_path / "reuse"
    document = run_json([*QUICK, "--out", str(out)], capsys)
    assert document["kind"] == "reuse" and document["meta"]["simulated"] is True
    points = document["points"]
    assert len(points) == 6 and [p["kv_blocks"] for p in points] == sorted(p["kv_blocks"] for p in points)
    unbounded = document["unbounded"]["hit_rate_pct"]
    assert 0 < unbounded < 100
    assert all(0 <= p["hit_rate_pct"] <= unbounded + 1e-9 for p in points)
    assert points[-1]["hit_rate_pct"] == pytest.approx(unbounded)  # 64x the deployment holds everything
    asked = document["deployments"][0]
    assert asked["gpus"] == 1 and asked["kv_bytes"] == asked["kv_blocks"] * document["deployment"]["kv_block_bytes"]
    # Llama-3-8B in bf16: 128 KiB per token, blocks of 16 tokens
    assert document["deployment"]["kv_block_bytes"] == 16 * 131072
    assert [t["share_pct"] for t in document["targets"]] == [50, 90, 99]
    assert document["findings"] and document["reuse_distance"]["reuses"] > 0
    for name in ("summary.json", "summary.csv", "summary.md", "reuse.png", "reuse_distance.png"):
        assert (out / name).is_file(), name
    page = write_report(out)
    html = page.path.read_text()
    assert "Hit rate per KV size" in html and "SIMULATED" in html and html.count("<svg") >= 2


def test_a_cpu_tier_only_adds_hits(tmp_path, capsys):
    document = run_json([*QUICK, "--offload", "256GiB", "--out", str(tmp_path / "r")], capsys)
    for point in document["points"]:
        assert point["total_hit_rate_pct"] >= point["hit_rate_pct"] - 1e-9
    assert any(p["total_hit_rate_pct"] > p["hit_rate_pct"] for p in document["points"])
    assert "CPU tier" in " ".join(document["findings"])


def test_shared_prefix_groups(tmp_path, capsys):
    args = ["--prefix-groups", "4", "--prefix-len", "512", "--suffix-len", "64", "--requests", "200"]
    document = run_json([*args, "--points", "4", "--out", str(tmp_path / "r")], capsys)
    # 4 groups: all but the first request of each reuse the 512-token prefix (of 576 prompt tokens)
    assert document["unbounded"]["hit_rate_pct"] == pytest.approx(100 * (200 - 4) * 512 / (200 * 576))


def test_a_requests_file_with_arrival_times(tmp_path, capsys):
    path = tmp_path / "requests.jsonl"
    shared = list(range(100, 164))
    rows = [{"prompt_token_ids": shared + [7 + i] * 16, "output_len": 4, "arrival_time": i * 0.5} for i in range(5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    document = run_json(["--requests-file", str(path), "--points", "3", "--out", str(tmp_path / "r")], capsys)
    assert document["trace"]["requests"] == 5
    assert document["unbounded"]["hit_rate_pct"] == pytest.approx(100 * 4 * 64 / (5 * 80))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--trace", "/nonexistent.jsonl"], "trace not found"),
        (["--block-size", "24"], "not a whole number of KV blocks of 24"),
        (["--window", "5:2"], "--window: cannot read"),
        (["--time-scale", "0"], "--time-scale must be above 0"),
        (["--time-scale", "1e300"], "--time-scale must be above 0"),
        (["--prefix-groups", "2", "--rate", "nan"], "--rate must be between 0.001 and"),
        (["--prefix-groups", "2", "--requests", "1000000000"], "--requests"),
        (["--offload", "1B"], "holds no KV block"),
        (["--trace-block-size", "0"], "--trace-block-size"),
        (["--kv-sizes", "lots"], "--kv-sizes: cannot read"),
        (["--prefix-groups", "2", "--trace", "mooncake-conversation-1k"], "each give the requests"),
        (["--model", "llama-2-70b", "--gpu", "l4-24g"], "does not fit"),
        (["--window", "100000:200000"], "no request is left"),
    ],
)
def test_bad_input_is_one_line(args, message, tmp_path, capfd):
    assert main(["reuse", *args, "--out", str(tmp_path / "r")]) == 2
    captured = capfd.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert message in err
    assert not (tmp_path / "r").exists()


def test_a_bad_trace_line_is_named(tmp_path, capfd):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n')
    assert main(["reuse", "--trace", str(path), "--out", str(tmp_path / "r")]) == 2
    err = capfd.readouterr().err.strip()
    assert err == (
        f"error: {path}:1: 1 hash ids for 600 prompt tokens: fewer than the 2 blocks of 512 tokens the prompt holds"
    )


def test_compare_judges_the_hit_rates_exactly(tmp_path, capsys):
    base, head = tmp_path / "base", tmp_path / "head"
    for out in (base, head):
        run_json(["--max-requests", "120", "--points", "3", "--out", str(out)], capsys)
    assert main(["compare", str(base), str(head)]) == 0
    assert "8 unchanged" in capsys.readouterr().out  # hit rate and prefill time saved at the 4 deployments
    summary = json.loads((head / "summary.json").read_text())
    summary["points"][1]["hit_rate_pct"] -= 0.5
    (head / "summary.json").write_text(json.dumps(summary))
    assert main(["compare", str(base), str(head)]) == 1
    assert "hit_rate_pct" in capsys.readouterr().out


def test_multi_turn_sessions_reuse_their_history(tmp_path, capsys):
    one = run_json(["--prefix-groups", "1", "--requests", "20", "--points", "2", "--out", str(tmp_path / "a")], capsys)
    args = ["--prefix-groups", "1", "--requests", "20", "--turns", "4", "--points", "2", "--out", str(tmp_path / "b")]
    four = run_json(args, capsys)
    assert four["trace"]["requests"] == 80
    assert four["unbounded"]["hit_rate_pct"] > one["unbounded"]["hit_rate_pct"]


def test_a_sharegpt_dataset(tmp_path, capsys):
    path = tmp_path / "chat.json"
    talk = [{"from": "human", "value": "word " * 40}, {"from": "gpt", "value": "reply " * 40}]
    path.write_text(json.dumps([{"conversations": talk * 3}] * 5))
    document = run_json(
        ["--dataset", str(path), "--block-size", "16", "--points", "2", "--out", str(tmp_path / "r")], capsys
    )
    assert document["trace"]["requests"] == 15 and document["unbounded"]["hit_rate_pct"] > 50


@pytest.mark.parametrize("deployment", [[], ["-tp", "2", "--kv-cache-dtype", "fp8"], ["--gpu", "a100-80g", "-pp", "2"]])
def test_the_deployment_has_capacitys_block_count(deployment, tmp_path, capsys):
    assert main(["capacity", "--model", "llama-3-8b", "--gpu", "h100-80g", *deployment, "--json"]) == 0
    strategies = json.loads(capsys.readouterr().out)["strategies"]
    blocks = next(s["kv_blocks"] for s in strategies if s["strategy"] == "paged-16")
    args = ["--model", "llama-3-8b", "--gpu", "h100-80g", *deployment, "--max-requests", "50", "--points", "0"]
    document = run_json([*args, "--out", str(tmp_path / "r")], capsys)
    assert document["deployments"][0]["kv_blocks"] == blocks


def test_compare_refuses_a_simulated_flag_that_is_not_a_boolean(tmp_path, capfd):
    base = tmp_path / "base"
    assert main(["reuse", "--max-requests", "60", "--points", "0", "--out", str(base), "--json"]) == 0
    capfd.readouterr()
    head = tmp_path / "head"
    head.mkdir()
    summary = json.loads((base / "summary.json").read_text())
    summary["meta"]["simulated"] = "yes"
    (head / "summary.json").write_text(json.dumps(summary))
    assert main(["compare", str(base), str(head)]) == 2
    assert "meta.simulated must be true or false" in capfd.readouterr().err


def test_requests_longer_than_the_context_are_left_out_and_said(tmp_path, capsys):
    document = run_json(
        ["--model", "llama-3-8b", "--max-requests", "200", "--points", "0", "--out", str(tmp_path)], capsys
    )
    trace = document["trace"]
    assert trace["context_tokens"] == 8192 and trace["over_context"] > 0
    assert trace["requests"] + trace["over_context"] == 200
    assert any("longer (prompt and output) than the model's context of 8,192" in f for f in document["findings"])
    assert main(["reuse", "--model", "llama-3-8b", "--max-model-len", "16", "--out", str(tmp_path / "x")]) == 2


def test_larger_deployments_that_add_no_kv_memory_are_not_marked(tmp_path, capsys):
    # a KV cache set per GPU: past 8 GPUs tensor parallelism replicates Llama's 8 KV heads and adds no block
    args = ["-tp", "2", "--kv-memory", "8GiB", "--max-requests", "50", "--points", "0", "--out", str(tmp_path)]
    deployments = run_json(args, capsys)["deployments"]
    blocks = [d["kv_blocks"] for d in deployments]
    assert blocks == sorted(set(blocks)) and [d["gpus"] for d in deployments] == [2, 4, 8]
