"""Opt-in: a real vLLM OpenAI server on 127.0.0.1, diagnosed and watched by kvbench.

The default test run never starts a server: this module runs only when KVBENCH_VLLM_PYTHON and KVBENCH_VLLM_MODEL
are set, and skips (never fails) when either is unusable (tests/vllm_server.py starts and stops the server). The
server's ``VLLM_CPU_KVCACHE_SPACE`` is what the capacity check below hands to ``kvbench capacity`` as
``--kv-memory``.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request

import pytest
from vllm_server import MODEL, requires_vllm, vllm_server

from kvbench.cli import main
from kvbench.report.diagnose import read_states, scrape

pytestmark = requires_vllm


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    with vllm_server(tmp_path_factory.mktemp("vllm")) as run:
        yield run


@pytest.fixture(scope="module")
def vllm_base(vllm_run):
    return vllm_run.base


def _complete(base: str, index: int, results: list) -> None:
    body = {
        "model": MODEL,
        "prompt": f"Write a short story about robot number {index}.",
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        f"{base}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:  # noqa: S310 (127.0.0.1 only)
        results[index] = json.loads(response.read())["usage"]["completion_tokens"]


def test_diagnose_and_watch_a_live_vllm_server(vllm_base, tmp_path, capsys):
    url = f"{vllm_base}/metrics"
    assert main(["diagnose", "--metrics-url", url, "--json"]) == 0
    idle = json.loads(capsys.readouterr().out)
    assert idle["checked"] == 1 and {n["rule"] for n in idle["not_evaluated"]} >= {"fragmentation"}
    (before,) = read_states(scrape(url), url)

    results = [None] * 6
    threads = [threading.Thread(target=_complete, args=(vllm_base, i, results)) for i in range(6)]
    for thread in threads:
        thread.start()
    out = tmp_path / "watch"
    assert main(["watch", "--metrics-url", url, "--scrape-interval", "0.5", "--duration", "4", "--out", str(out)]) == 0
    for thread in threads:
        thread.join(timeout=600)
    assert results == [48] * 6
    samples = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()[1:]]
    states = [s["state"] for s in samples if "state" in s]
    assert states and all(s["family"] == "vllm" for s in states)
    assert max(s["running"] for s in states) >= 1  # the watch saw the requests run
    assert max(s["usage"] for s in states) > 0 and states[0]["block_size"] and states[0]["total_blocks"]
    assert (out / "watch.png").read_bytes().startswith(b"\x89PNG")
    capsys.readouterr()
    assert main(["diagnose", str(out / "timeline.jsonl"), "--json"]) in (0, 1)
    watched = json.loads(capsys.readouterr().out)
    assert watched["checked"] == 1 and watched["measurements"]
    assert main(["diagnose", "--metrics-url", url, "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    rate = next(m for m in after["measurements"] if m["name"] == "prefix_cache_hit_rate")
    assert 0 <= rate["value"] <= 1
    (now,) = read_states(scrape(url), url)
    assert now.finished - before.finished == 6 and now.running == 0 and now.usage == 0


def test_capacity_equals_vllm_cpus_own_block_count(vllm_run, capsys):
    """vLLM logs "CPU KV cache size: N tokens, Maximum concurrency for 1,024 tokens per request: X" at start-up and
    exports its block size and block count; kvbench's paged capacity for the same model, dtype, KV memory and
    block size must be the same numbers."""
    log = vllm_run.log.read_text(errors="replace")
    found = re.search(
        r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
        r"([\d.]+)x",
        log,
    )
    assert found, "vLLM's start-up log has no KV cache size line"
    tokens, max_len, concurrency = int(found[1].replace(",", "")), int(found[2].replace(",", "")), float(found[3])
    (state,) = read_states(scrape(f"{vllm_run.base}/metrics"), vllm_run.base)
    block_size, blocks = state.block_size, int(state.config["num_gpu_blocks"])  # the pool, its null block included
    assert (
        main(
            [
                "capacity",
                "--model",
                MODEL,
                "--dtype",
                "fp32",
                "--kv-memory",
                f"{vllm_run.kv_space_gib}GiB",
                "--block-size",
                str(block_size),
                "--max-model-len",
                str(max_len),
                "--mean-len",
                str(max_len),
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    (paged,) = [row for row in result["strategies"] if row["strategy"] == f"paged-{block_size}"]
    assert paged["kv_blocks"] == blocks
    assert paged["kv_cache_tokens"] == tokens
    assert round(paged["concurrency_ratio_at_max_len"], 2) == concurrency
