"""The thread policy: the user's number wins, then KVBENCH_THREADS, else a measurement of the model's matmul."""

from __future__ import annotations

import pytest
import torch

from kvbench.errors import KvbenchError
from kvbench.models import threads as threads_module
from kvbench.models.threads import choose_threads, parse_threads


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_parse():
    assert parse_threads("auto") is None and parse_threads(None) is None and parse_threads("2") == 2
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(KvbenchError, match="positive integer or auto"):
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
