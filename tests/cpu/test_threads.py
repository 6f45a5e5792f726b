"""The thread policy: the user's number wins, then KVBENCH_THREADS, else a measurement of the model's matmul."""

from __future__ import annotations

import pytest
import torch

from kvbench.cpu import threads as threads_module
from kvbench.cpu.threads import choose_threads, parse_threads
from kvbench.errors import KvbenchError


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_parse():
    assert parse_threads("auto") is None and parse_threads(None) is None and parse_threads("2") == 2
    for bad in ("two", "1.5"):
        with pytest.raises(KvbenchError, match="positive integer or auto"):
            parse_threads(bad)
    for bad in ("0", "-1", "99999"):  # 99,999 threads start no pool: refused up front
        with pytest.raises(KvbenchError, match="between 1 and 4,096 or auto"):
            parse_threads(bad)


def test_the_user_and_the_environment_decide_before_any_measurement(monkeypatch):
    monkeypatch.delenv(threads_module.ENV, raising=False)
    choice = choose_threads(64, 128, requested=1)
    assert (choice.threads, choice.reason) == (1, "set by the user") and torch.get_num_threads() == 1
    monkeypatch.setenv(threads_module.ENV, "1")
    assert choose_threads(64, 128).reason == f"set by {threads_module.ENV}"


def test_auto_measures_and_keeps_the_faster(monkeypatch):
    monkeypatch.delenv(threads_module.ENV, raising=False)
    monkeypatch.setattr(threads_module, "available_cores", lambda: 2)
    choice = choose_threads(64, 128)
    assert choice.threads in (1, 2) and "1 thread(s)" in choice.reason and "2 thread(s)" in choice.reason
    assert torch.get_num_threads() == choice.threads
    monkeypatch.setattr(threads_module, "available_cores", lambda: 1)
    assert choose_threads(64, 128).threads == 1


def test_auto_times_the_engines_own_matmul(monkeypatch):
    """The thread choice times the weight as the runner multiplies it: AMX for bfloat16 values, else oneDNN."""
    from kvbench.cpu import cpu_linear
    from kvbench.kernels import cpu_amx

    monkeypatch.delenv(threads_module.ENV, raising=False)
    monkeypatch.setattr(threads_module, "available_cores", lambda: 2)
    weight = torch.randn(1024, 256) / 16
    x = torch.randn(16, 256)
    for values, expected in ((weight, "oneDNN-packed"), (weight.bfloat16().float(), "AMX")):
        linear, path = cpu_linear.probe_linear(values)
        if expected == "AMX" and not cpu_amx.available():
            assert path == "oneDNN-packed"
            continue
        assert path == expected
        torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, values), rtol=1e-5, atol=1e-5)
        calls: list = []

        def counted(rows, calls=calls, linear=linear):
            calls.append(rows.shape)
            return linear(rows)

        choice = choose_threads(256, 512, probe=lambda counted=counted, path=path: (counted, path))
        assert f"the model's {path} [16 x 256] decode matmul" in choice.reason
        assert len(calls) == 2 * 2 * threads_module.ROUNDS  # every candidate, every round, untimed call and timed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_are_timed_at_their_dtype(monkeypatch, dtype):
    """The probe multiplies activations of the model's dtype (float32 ones against a bfloat16 weight made oneDNN
    fail and float16 ones F.linear)."""
    from kvbench.cpu import cpu_linear

    monkeypatch.delenv(threads_module.ENV, raising=False)
    monkeypatch.setattr(threads_module, "available_cores", lambda: 2)
    weight = (torch.randn(512, 256) / 16).to(dtype)
    choice = choose_threads(256, 256, probe=lambda: cpu_linear.probe_linear(weight), dtype=dtype)
    assert choice.threads in (1, 2) and "[16 x 256] decode matmul" in choice.reason
    assert "plain" in choose_threads(256, 256, dtype=dtype).reason  # no probe: a random weight of that dtype


def test_the_timings_are_cached_per_machine_and_shape(monkeypatch, tmp_path):
    monkeypatch.delenv(threads_module.ENV, raising=False)
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(threads_module, "available_cores", lambda: 2)
    first = choose_threads(64, 128, cache=True)
    assert "measured now at load" in first.reason and len(list((tmp_path / "cache").glob("cpu-threads-*"))) == 1
    again = choose_threads(64, 128, cache=True)
    assert (again.threads, again.reason.split(";")[0]) == (first.threads, first.reason.split(";")[0])
    assert "cached, measured" in again.reason
    assert "measured now" in choose_threads(64, 256, cache=True).reason  # another shape: measured
