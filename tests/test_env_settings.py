"""kvbench's environment variables: each declared once, an empty value meaning unset, a value outside its meaning
one error line naming the variable (never a traceback)."""

from __future__ import annotations

import pytest

from kvbench import env_settings
from kvbench.cli import main


def test_an_empty_or_blank_value_is_unset(monkeypatch):
    for value in ("", "  "):
        monkeypatch.setenv("KVBENCH_KERNEL_BACKEND", value)
        assert env_settings.read("KVBENCH_KERNEL_BACKEND") is None
        assert env_settings.read("KVBENCH_KERNEL_BACKEND", "torch") == "torch"
    monkeypatch.setenv("KVBENCH_KERNEL_BACKEND", "native")
    assert env_settings.read("KVBENCH_KERNEL_BACKEND") == "native"
    with pytest.raises(KeyError):
        env_settings.read("KVBENCH_NOT_DECLARED")


@pytest.mark.parametrize("value", ["abc", "-1", "1e999", "x" * 5000])
def test_a_kernel_backend_outside_its_choices_is_one_error_line(value, monkeypatch, capfd):
    monkeypatch.setenv("KVBENCH_KERNEL_BACKEND", value)
    args = ["kernels", "--device", "cpu", "--model", "tiny", "--batch", "1", "--context", "64", "--repeat", "1"]
    assert main([*args, "--warmup", "0"]) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: unknown kernel backend")


@pytest.mark.parametrize(("value", "on"), [("1", True), ("0", False), ("off", False), ("YES", True), ("", True)])
def test_a_switch_reads_on_and_off_and_empty_as_its_default(value, on, monkeypatch):
    monkeypatch.setenv("KVBENCH_AMX", value)
    assert env_settings.switch("KVBENCH_AMX", True) is on


@pytest.mark.parametrize("value", ["abc", "-1", "2", "1e999"])
def test_a_switch_outside_on_and_off_is_refused_naming_the_variable(value, monkeypatch):
    from kvbench.errors import KvbenchError

    monkeypatch.setenv("KVBENCH_AMX", value)
    with pytest.raises(KvbenchError, match="KVBENCH_AMX=.* is neither on nor off"):
        env_settings.switch("KVBENCH_AMX", True)
