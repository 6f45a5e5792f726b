"""The host and package facts a run records for its provenance."""

from __future__ import annotations

from importlib.metadata import version

from kvbench.results import environment
from kvbench.results.run_meta import run_meta


def test_the_host_and_packages_are_recorded():
    meta = run_meta(extra=1)
    assert meta["extra"] == 1
    host = meta["host"]
    assert host["cores"] >= 1 and host["memory_bytes"] > 2**20
    assert host["cpu"]  # /proc/cpuinfo's model name on Linux
    assert meta["packages"]["jinja2"] == version("jinja2") and meta["packages"]["torch"] == version("torch")
    assert "not-a-package" not in meta["packages"]


def test_no_gpu_without_cuda(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "torch", raising=False)  # a process that never imported torch
    assert environment.gpu_info() is None
