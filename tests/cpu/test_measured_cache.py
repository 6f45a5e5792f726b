"""Measurements kept per machine and shape: measured once, read back after, measured again when asked, when the
file does not fit, and (without keeping it) when the cache folder is not this user's alone."""

from __future__ import annotations

import json
import stat

import pytest

from kvbench.cpu import measured_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(measured_cache.REMEASURE_ENV, raising=False)
    monkeypatch.setattr(measured_cache.os, "getloadavg", lambda: (0.5, 0.5, 0.5))  # a steady load, whatever runs
    return tmp_path / "cache"


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> dict:
        self.calls += 1
        return {"value": 10 * self.calls}


def check(record: dict) -> None:
    if not isinstance(record["value"], int):
        raise TypeError("value is not a number")


def test_measured_once_then_read_back_with_its_provenance(cache) -> None:
    measure = Counter()
    first = measured_cache.measured("probe", {"shape": [4, 8]}, measure, check)
    assert (first.record, first.cached, measure.calls) == ({"value": 10}, False, 1)
    assert first.provenance().startswith("measured now at load ")
    (path,) = cache.glob("probe-*.json")
    assert first.path == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    second = measured_cache.measured("probe", {"shape": [4, 8]}, measure, check)
    assert (second.record, second.cached, measure.calls) == ({"value": 10}, True, 1)
    assert f"measured {first.measured_at} at load {first.load}" in second.provenance()
    assert "KVBENCH_REMEASURE=1 measures again" in second.provenance()
    other = measured_cache.measured("probe", {"shape": [4, 9]}, measure, check)  # another shape: its own file
    assert other.record == {"value": 20} and len(list(cache.glob("probe-*.json"))) == 2


def test_remeasured_when_asked(cache, monkeypatch) -> None:
    measure = Counter()
    measured_cache.measured("probe", {}, measure, check)
    monkeypatch.setenv(measured_cache.REMEASURE_ENV, "1")
    assert measured_cache.measured("probe", {}, measure, check).record == {"value": 20}
    monkeypatch.delenv(measured_cache.REMEASURE_ENV)
    assert measured_cache.measured("probe", {}, measure, check).record == {"value": 20}  # the new one was kept


def test_a_choice_measured_on_a_busy_machine_is_measured_again_once_it_is_quiet(cache, capsys, monkeypatch) -> None:
    measure = Counter()
    cpus = measured_cache.os.cpu_count() or 1
    monkeypatch.setattr(measured_cache.os, "getloadavg", lambda: (2.0 * cpus, cpus, cpus))  # oversubscribed
    busy = measured_cache.measured("probe", {}, measure, check)
    assert not busy.cached and busy.load.startswith(f"{2.0 * cpus:.2f}")
    assert measured_cache.measured("probe", {}, measure, check).cached  # still busy: the same choice holds
    monkeypatch.setattr(measured_cache.os, "getloadavg", lambda: (0.4 * cpus, cpus, cpus))
    quiet = measured_cache.measured("probe", {}, measure, check)
    assert (quiet.cached, quiet.record, measure.calls) == (False, {"value": 20}, 2)
    assert "measured on a busy machine" in capsys.readouterr().err
    assert measured_cache.measured("probe", {}, measure, check).cached  # measured quiet: kept from now on
    assert measured_cache.busier_then("unknown", "0.1 0.1 0.1") is False
    assert measured_cache.busier_then("3.0 1 1", "1.5 1 1", cpus=2) is True
    assert measured_cache.busier_then("2.9 1 1", "0.1 1 1", cpus=2) is False  # 1.45 per CPU: not busy


@pytest.mark.parametrize("damage", ["not json", "wrong record", "other descriptor", "missing keys"])
def test_a_file_that_does_not_fit_is_measured_again_with_a_note(cache, capsys, damage: str) -> None:
    measure = Counter()
    first = measured_cache.measured("probe", {"a": 1}, measure, check)
    stored = json.loads(first.path.read_text())
    if damage == "not json":
        first.path.write_text("{ torn")
    elif damage == "wrong record":
        stored["record"]["value"] = "fast"
        first.path.write_text(json.dumps(stored))
    elif damage == "other descriptor":
        stored["descriptor"]["a"] = 2
        first.path.write_text(json.dumps(stored))
    else:
        first.path.write_text(json.dumps({"record": stored["record"]}))
    capsys.readouterr()
    again = measured_cache.measured("probe", {"a": 1}, measure, check)
    assert again.record == {"value": 20} and not again.cached
    note = capsys.readouterr().err.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("kvbench: note: measuring the CPU choices again: ")
    assert measured_cache.measured("probe", {"a": 1}, measure, check).cached  # and rewritten whole


def test_an_unsafe_cache_folder_is_not_read_nor_written(cache, capsys) -> None:
    cache.mkdir(mode=0o700)
    cache.chmod(0o777)
    measure = Counter()
    result = measured_cache.measured("probe", {}, measure, check)
    assert result.record == {"value": 10} and result.path is None and not list(cache.iterdir())
    assert "may be written by other users" in capsys.readouterr().err
