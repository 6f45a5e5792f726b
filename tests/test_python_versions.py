"""Python 3.10 is supported (``requires-python``): TOML is read with tomli there, tomllib from 3.11 on."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

from kvbench.workload.scenario import tomllib  # whichever this interpreter reads TOML with

ROOT = Path(__file__).resolve().parents[1]
TOML_READERS = ["kvbench/workload/scenario.py", "kvbench/report/diagnose/thresholds.py"]


def _load_as_on(version: tuple[int, int], relative: str, monkeypatch) -> types.ModuleType:
    """The module's top level run afresh (under a name of its own) as an interpreter of ``version`` runs it."""
    monkeypatch.setattr(sys, "version_info", (*version, 0, "final", 0))
    spec = importlib.util.spec_from_file_location(f"_py{version[0]}{version[1]}_{Path(relative).stem}", ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("relative", TOML_READERS)
def test_python_3_10_reads_toml_with_tomli(relative, monkeypatch):
    tomli = types.ModuleType("tomli")
    tomli.loads, tomli.TOMLDecodeError = tomllib.loads, tomllib.TOMLDecodeError  # the same API
    monkeypatch.setitem(sys.modules, "tomli", tomli)
    assert _load_as_on((3, 10), relative, monkeypatch).tomllib is tomli


@pytest.mark.skipif(sys.version_info < (3, 11), reason="no tomllib before Python 3.11")
@pytest.mark.parametrize("relative", TOML_READERS)
def test_python_3_11_reads_toml_with_the_standard_library(relative, monkeypatch):
    monkeypatch.setitem(sys.modules, "tomli", None)  # not installed: never imported
    assert _load_as_on((3, 11), relative, monkeypatch).tomllib is tomllib


def test_the_package_declares_tomli_for_python_3_10():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["requires-python"] == ">=3.10"
    assert any(
        dep.replace(" ", "").startswith("tomli") and "python_version<'3.11'" in dep.replace(" ", "")
        for dep in project["dependencies"]
    )
