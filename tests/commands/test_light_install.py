"""The commands a production host runs without the engine: none imports torch, transformers or anything else
that only ``sweep``, ``fleet``, ``serve``, ``share`` and ``kernels`` need (the README's light install).

Each command runs in a fresh interpreter where those packages are absent (importing one fails as if it were not
installed, and the attempt is recorded), then reports whether it tried and what it left in ``sys.modules``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Not in the light install: the engine (torch, transformers, safetensors, triton), the server and clients
# (aiohttp), the Hub (a Hugging Face id only), NVML, Ray and the reference engines.
ABSENT = (
    "torch",
    "transformers",
    "safetensors",
    "triton",
    "aiohttp",
    "huggingface_hub",
    "pynvml",
    "ray",
    "vllm",
    "sglang",
    "accelerate",
    "gguf",
    "tokenizers",
)

PROBE = """
import json, sys
from importlib.abc import MetaPathFinder

ABSENT = set(json.loads(sys.argv[1]))
attempted = []


class Absent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            attempted.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Absent())
from kvbench.cli import main

code = main(sys.argv[2:])
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ABSENT)
print(json.dumps({"code": code, "attempted": attempted, "loaded": loaded}), file=sys.stderr)
"""


def run_light(*argv: str, absent: tuple[str, ...] = ABSENT) -> tuple[int, str]:
    """``kvbench ARGV`` on a host without ``absent``: its exit code and stdout; fails if it tried one."""
    env = {**os.environ, "COLUMNS": "160"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(absent), *argv], capture_output=True, text=True, env=env, timeout=300
    )
    lines = done.stderr.strip().splitlines()
    assert lines, f"kvbench {' '.join(argv)} printed nothing on stderr (exit {done.returncode})"
    try:
        report = json.loads(lines[-1])
    except json.JSONDecodeError:
        raise AssertionError(f"kvbench {' '.join(argv)} did not finish:\n{done.stderr[-3000:]}") from None
    assert report["attempted"] == [] and report["loaded"] == [], report
    return report["code"], done.stdout


@pytest.fixture(scope="module")
def waste_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("light") / "waste"
    code, stdout = run_light("waste", "--requests", "40", "--concurrency", "8", "--out", str(out), "--json")
    assert code == 0
    assert json.loads(stdout)["kind"] == "waste" and (out / "summary.json").exists() and (out / "waste.png").exists()
    return out


def test_waste(waste_run):
    assert json.loads((waste_run / "summary.json").read_text())["points"]


def test_reuse(tmp_path):
    out = tmp_path / "reuse"
    code, stdout = run_light("reuse", "--max-requests", "100", "--points", "3", "--out", str(out), "--json")
    assert code == 0 and json.loads(stdout)["kind"] == "reuse" and (out / "reuse.png").exists()


def test_capacity_of_a_preset_and_of_a_config_file(tmp_path):
    code, stdout = run_light("capacity", "--model", "llama-2-13b", "--json")
    assert code == 0 and json.loads(stdout)["bytes_per_token"] == 819_200
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, stdout = run_light("capacity", "--model", str(tmp_path), "--gpu", "l4-24g", "--json")
    assert code == 0 and json.loads(stdout)["bytes_per_token"] == 2 * 4 * 2 * 32 * 2


def test_dataset_with_a_preset_model(tmp_path):
    code, stdout = run_light("dataset", "real-chat", "--requests", "20", "--out", str(tmp_path / "d"), "--json")
    assert code == 0 and json.loads(stdout)["kind"] == "dataset"


def test_diagnose_compare_and_report_of_a_run(waste_run, tmp_path):
    code, stdout = run_light("diagnose", str(waste_run), "--json")
    assert code == 0 and "findings" in json.loads(stdout)
    code, stdout = run_light("compare", str(waste_run), str(waste_run))
    assert code == 0 and "PASS" in stdout.upper()
    code, _ = run_light("report", str(waste_run), "--out", str(tmp_path / "page.html"))
    assert code == 0 and (tmp_path / "page.html").read_text().startswith("<!")
    code, _ = run_light("diagnose", "--emit-prometheus-rules", str(tmp_path / "rules.yaml"))
    assert code == 0 and "alert:" in (tmp_path / "rules.yaml").read_text()


def test_watch_and_diagnose_a_live_endpoint(metrics_server, vllm_exposition, tmp_path):
    """A live endpoint is read through aiohttp (the hardened fetch: deadlines, caps, redirects checked), the one
    package these two add to the light install; the timeline is judged without it."""
    with_http = tuple(name for name in ABSENT if name != "aiohttp")
    server = metrics_server.serve([vllm_exposition(usage=0.2, running=8, waiting=w) for w in (0, 3, 6)])
    out = tmp_path / "w"
    code, _ = run_light(
        "watch",
        "--metrics-url",
        server.url,
        "--scrape-interval",
        "0.05",
        "--duration",
        "0.2",
        "--out",
        str(out),
        absent=with_http,
    )
    assert code == 0 and (out / "timeline.jsonl").exists() and (out / "watch.png").exists()
    code, stdout = run_light("diagnose", str(out / "timeline.jsonl"), "--json")
    assert code == 0 and json.loads(stdout)["source"].endswith("timeline.jsonl")
    code, stdout = run_light("diagnose", "--metrics-url", server.url, "--json", absent=with_http)
    assert code == 0 and json.loads(stdout)["source"] == server.url


def test_help_version_and_scenarios():
    for argv in (["--help"], ["--version"], ["scenarios"], ["diagnose", "--help"], ["capacity", "--help"]):
        code, stdout = run_light(*argv)
        assert code == 0 and stdout.strip(), argv


def test_a_command_that_needs_the_full_install_says_so_in_one_line(tmp_path):
    env = {**os.environ}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(ABSENT), "kernels"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    message = done.stderr.strip().splitlines()[0]
    assert message == (
        "error: this command needs torch, which is not installed (pip install torch; "
        "`pip install kvbench` installs what every command needs)"
    )
    assert json.loads(done.stderr.strip().splitlines()[-1])["code"] == 2
