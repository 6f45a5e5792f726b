"""vLLM's own metric code as an oracle for ``metrics.py``: the same request records handed to ``vllm bench
serve``'s ``calculate_metrics`` in a Python that has vLLM (its own virtual environment: vLLM pins its own
torch), and the figures compared name by name.

Used by the benchmark against ``vllm bench serve`` and by an opt-in test; nothing else imports vLLM.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvbench.endpoint.record import RequestRecord

_SCRIPT = """
import json, sys, warnings
warnings.simplefilter("ignore")
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
from vllm.benchmarks import serve
serve.TERM_PLOTLIB_AVAILABLE = False
data = json.load(open(sys.argv[1]))
outputs = [RequestFuncOutput(**row) for row in data["outputs"]]
metrics, _ = serve.calculate_metrics([], outputs, data["duration"], None, data["percentiles"], data["slo"])
out = {k: v for k, v in vars(metrics).items() if not k.startswith("percentiles_")}
for name in ("ttft", "tpot", "itl", "e2el"):
    for p, value in getattr(metrics, "percentiles_%s_ms" % name):
        out["p%s_%s_ms" % (int(p) if int(p) == p else p, name)] = value
json.dump({k: float(v) for k, v in out.items()}, sys.stdout)
"""

# our name -> vLLM's (BenchmarkMetrics field); the rest share theirs
_RENAMED = {"total_input_tokens": "total_input", "total_output_tokens": "total_output"}
COMPARED = (
    "completed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    *(
        f"{stat}_{name}_ms"
        for name in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p90", "p99")
    ),
)


def vllm_outputs(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """The records as vLLM's ``RequestFuncOutput`` fields (its bench counts a failed request's nothing)."""
    return [
        {
            "success": r.ok,
            "ttft": r.ttft or 0.0,
            "latency": r.latency or 0.0,
            "itl": r.itl,
            "output_tokens": r.output_tokens or 0,
            "prompt_len": r.prompt_tokens or 0,
            "start_time": r.start,
            "error": r.error or "",
        }
        for r in records
    ]


def vllm_metrics(
    python: str,
    records: Sequence[RequestRecord],
    duration_s: float,
    slo: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = (90, 99),
) -> dict[str, float]:
    """vLLM's ``calculate_metrics`` over ``records``, run by ``python`` (a Python that imports vllm)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "outputs.json"
        path.write_text(
            json.dumps(
                {
                    "outputs": vllm_outputs(records),
                    "duration": duration_s,
                    "percentiles": list(percentiles),
                    "slo": dict(slo or {}),
                }
            )
        )
        done = subprocess.run(
            [python, "-c", _SCRIPT, str(path)], capture_output=True, text=True, timeout=600, cwd=folder
        )
    if done.returncode != 0:
        raise RuntimeError(f"vLLM's calculate_metrics failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def differences(ours: Mapping[str, Any], theirs: Mapping[str, float]) -> dict[str, tuple[Any, float | None]]:
    """The figures that differ (relative 1e-9), by our name: ``(ours, vLLM's)``."""
    out = {}
    for name in COMPARED:
        if name == "request_goodput" and ours.get(name) is None:
            continue
        mine, vllm = ours.get(name), theirs.get(_RENAMED.get(name, name))
        if mine is None or vllm is None or not math.isclose(float(mine), vllm, rel_tol=1e-9, abs_tol=1e-9):
            out[name] = (mine, vllm)
    return out
