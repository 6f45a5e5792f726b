"""Ray for kvbench: what a worker reserves (a GPU only for a CUDA run, never for a CPU run or a simulation:
tested without a GPU or Ray, the decision is a function of the device and the cluster's GPU count); one module
starting it, on the loopback interface only (checked on the sockets of the processes each entry point starts);
a cluster address probed before Ray waits on it."""

from __future__ import annotations

import ast
import ipaddress
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.errors import KvbenchError
from kvbench.studies.fleet import ray_runtime
from kvbench.studies.fleet.actor import InstanceSpec
from kvbench.studies.fleet.pool import InstancePool
from kvbench.studies.fleet.ray_runtime import actor_resources, uses_gpu


@pytest.mark.parametrize(
    ("device", "simulate", "gpus", "expected"),
    [
        ("cpu", False, 8, False),  # the fleet's default on a GPU cluster: CPU actors
        ("cuda", True, 8, False),  # simulated: no tensors
        ("auto", True, 8, False),
        ("cuda", False, 8, True),
        ("cuda:1", False, 8, True),
        ("auto", False, 8, True),  # auto becomes CUDA on a worker that holds a GPU
        ("auto", False, 0, False),
    ],
)
def test_a_gpu_is_reserved_only_for_cuda_runs(device, simulate, gpus, expected):
    assert uses_gpu(device, simulate, gpus) is expected


def test_more_cpu_workers_than_gpus_reserve_cpus():
    assert actor_resources("cpu", False, gpus=1, workers=4, cpus=0.5) == {"num_cpus": 0.5}
    assert actor_resources("cuda", True, gpus=1, workers=4) == {"num_cpus": 1.0}
    assert actor_resources("cuda", False, gpus=4, workers=4) == {"num_gpus": 1}


@pytest.mark.parametrize("gpus", [0, 2])
def test_cuda_workers_beyond_the_clusters_gpus_are_refused_not_left_waiting(gpus):
    with pytest.raises(KvbenchError, match=f"3 CUDA workers need a GPU each, and the Ray cluster has {gpus}"):
        actor_resources("cuda", False, gpus=gpus, workers=3)


def test_fleet_on_cuda_without_the_gpus_here_fails_before_ray_starts(tmp_path, capsys, monkeypatch):
    import torch

    from kvbench.cli import main
    from kvbench.studies.fleet import study

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(study, "ray_session", _no_ray)  # reaching Ray at all fails the test
    args = ["fleet", "--device", "cuda", "--instances", "2", "--requests", "2", "--rate", "1"]
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    assert "2 CUDA workers need a GPU each, and this machine has 1" in capsys.readouterr().err


def _no_ray(*args, **kwargs):
    raise AssertionError("Ray was started")


class _FakeRay:
    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.asked: dict = {}

    def cluster_resources(self) -> dict:
        return {"CPU": 16.0, "GPU": float(self.gpus)}

    def remote(self, **resources):
        self.asked = resources
        return lambda cls: cls


@pytest.mark.parametrize(("device", "asked"), [("cpu", {"num_cpus": 1.0}), ("cuda", {"num_gpus": 1})])
def test_the_instance_pool_asks_for_a_gpu_only_on_cuda(device, asked):
    ray = _FakeRay(gpus=2)
    InstancePool(ray, InstanceSpec("tiny", device, None, 0, EngineConfig()), instances=2)
    assert ray.asked == asked


# -- Ray on the loopback interface only ---------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[3]


def test_only_ray_runtime_imports_ray():
    """One module imports Ray, so the loopback-only setting it applies before the import cannot be skipped."""
    importers = []
    for path in (ROOT / "kvbench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            if any(name == "ray" or name.startswith("ray.") for name in names):
                importers.append(str(path.relative_to(ROOT)))
    assert sorted(set(importers)) == ["kvbench/studies/fleet/ray_runtime.py"]


_RUN = "import sys; from kvbench.cli import main; sys.exit(main(sys.argv[1:]))"


def _listeners_of_a_run(args: list[str], limit_s: float = 180.0) -> tuple[int, dict[str, set[str]], str]:
    """Run kvbench in a process of its own and, while it runs, poll the listening sockets of that process and
    every process under it (Ray's GCS, raylet, agents and workers): {process name: addresses}."""
    psutil = pytest.importorskip("psutil")
    process = subprocess.Popen(
        [sys.executable, "-c", _RUN, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT
    )
    seen: dict[str, set[str]] = {}
    deadline = time.monotonic() + limit_s
    try:
        root = psutil.Process(process.pid)
        while process.poll() is None and time.monotonic() < deadline:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            for member in tree:
                try:
                    name, connections = member.name(), member.net_connections(kind="inet")
                except psutil.Error:  # ended in between
                    continue
                for connection in connections:
                    if connection.status == psutil.CONN_LISTEN:
                        seen.setdefault(name, set()).add(connection.laddr.ip)
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate()[0].decode(errors="replace")
    return process.returncode, seen, output


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address.removeprefix("::ffff:")).is_loopback


@pytest.mark.parametrize(
    "args",
    [
        ["sweep", "--ray", "--simulate", "--scenario", "ci-smoke", "--concurrency", "2", "--requests", "4"],
        [
            "fleet",
            "--simulate",
            "--ray",
            "--ray-cpus",
            "1",
            "--instances",
            "2",
            "--rate",
            "5",
            "--requests",
            "10",
            "--policies",
            "round-robin",
        ],
        ["fleet", "--ray-cpus", "1", "--instances", "1", "--rate", "5", "--requests", "2", "--policies", "round-robin"],
    ],
    ids=["sweep --ray", "fleet --simulate --ray", "fleet"],
)
def test_every_ray_entry_point_listens_on_the_loopback_interface_only(args, tmp_path):
    pytest.importorskip("ray")
    code, seen, output = _listeners_of_a_run([*args, "--out", str(tmp_path / "run")])
    assert code == 0, output[-2000:]
    assert {"gcs_server", "raylet"} <= set(seen), seen  # Ray was seen up, listening
    assert {name: addresses for name, addresses in seen.items() if not all(_loopback(a) for a in addresses)} == {}


def test_a_local_cluster_off_the_loopback_interface_is_refused():
    class _Ray:
        class util:  # noqa: N801 - Ray's module name
            @staticmethod
            def get_node_ip_address() -> str:
                return "192.0.2.7"

    with pytest.raises(KvbenchError, match="came up on 192.0.2.7, not on the loopback interface"):
        ray_runtime._check_loopback(_Ray())


def test_ray_imported_before_kvbench_still_starts_on_the_loopback_interface(monkeypatch):
    """Something imported Ray first (its constant already read from the environment): kvbench sets it too."""
    constants = pytest.importorskip("ray._private.ray_constants")
    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    ray_runtime.prepare_ray()
    assert constants.ENABLE_RAY_CLUSTER is False
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # inherited by the processes Ray starts


# -- a Ray address is probed before ray.init, which waits for ever on anything else -------------------------
def _serve_once(handler) -> tuple[int, threading.Thread]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        with listener:
            listener.settimeout(10)
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                handler(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def _http_server(connection: socket.socket) -> None:
    connection.recv(4096)
    connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


def _silent_server(connection: socket.socket) -> None:
    time.sleep(ray_runtime.CONNECT_TIMEOUT_S + 2)


@pytest.mark.parametrize(
    "handler, message",
    [
        (_http_server, "does not answer as a Ray cluster (Ray speaks gRPC; it answered 'HTTP/1.1 400 Bad Request')"),
        (_silent_server, "did not answer within 3 s"),
    ],
)
def test_an_address_where_something_else_listens_is_refused_within_seconds(handler, message):
    port, thread = _serve_once(handler)
    start = time.monotonic()
    with pytest.raises(KvbenchError, match=re.escape(message)):
        ray_runtime.check_address(f"127.0.0.1:{port}")
    assert time.monotonic() - start < ray_runtime.CONNECT_TIMEOUT_S + 1.5
    thread.join(timeout=10)


def test_a_ray_clusters_own_address_passes_the_probe(ray_local):
    ray_runtime.check_address(ray_local.get_runtime_context().gcs_address)
