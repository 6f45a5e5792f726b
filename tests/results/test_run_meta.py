"""A run's meta typed for its readers: the record kept key for key, the typed fields read with the defaults its
readers assume where a run did not record them."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.results.run_meta import RunMeta, run_meta

BASELINE = Path(__file__).resolve().parents[2] / "reports" / "baseline"


def test_a_shipped_sweep_meta_round_trips_byte_for_byte_and_reads_typed():
    document = json.loads((BASELINE / "sweep" / "summary.json").read_text())
    meta = RunMeta.from_json(document["meta"])
    assert json.dumps(meta.to_json()) == json.dumps(document["meta"])
    assert meta.simulated is True and meta.interrupted is False
    assert meta.scenario == document["meta"]["scenario"] and meta.block_size == document["meta"]["block_size"]
    assert meta.max_len == document["meta"]["max_len"] and meta.reserve == document["meta"]["reserve"]
    assert meta.budget_source == document["meta"]["budget_source"]


def test_every_kind_of_meta_round_trips_in_its_own_key_order():
    for kind in ("sweep", "waste"):
        recorded = json.loads((BASELINE / kind / "summary.json").read_text())["meta"]
        assert list(RunMeta.from_json(recorded).to_json()) == list(recorded)
    fresh = run_meta(zeta=1, alpha=None)
    assert json.dumps(RunMeta.from_json(fresh).to_json()) == json.dumps(fresh)


def test_an_old_or_partial_meta_reads_with_the_readers_defaults():
    meta = RunMeta.from_json({})
    assert (meta.simulated, meta.interrupted, meta.from_dataset) == (False, False, False)
    assert meta.model_name is None and meta.device is None and meta.scenario is None
    assert meta.scenario_description == "" and meta.budget_source == "" and meta.stop_description == ""
    assert meta.stop == "length" and meta.reserve is None and meta.reserve_policy == "max"
    assert meta.max_len is None and meta.block_size is None and meta.threads is None
    assert meta.to_json() == {}


def test_threads_read_from_a_cpu_run_record_or_a_bare_count():
    assert RunMeta.from_json({"threads": {"threads": 4, "reason": "measured"}}).threads == 4
    assert RunMeta.from_json({"threads": 2}).threads == 2
    assert RunMeta.from_json({"threads": "many"}).threads is None
    assert RunMeta.from_json({"threads": None}).threads is None


def test_values_of_another_kind_are_not_taken_for_settings():
    meta = RunMeta.from_json({"max_len": "long", "block_size": True, "reserve": "", "dataset": {"path": "x"}})
    assert meta.max_len is None and meta.block_size is None and meta.reserve is None
    assert meta.from_dataset is True
    assert RunMeta.from_json({"model_name": None}).model_name == "None"  # recorded, shown as the title shows it


def test_of_keeps_a_typed_meta_and_types_a_mapping():
    typed = RunMeta.from_json({"simulated": True})
    assert RunMeta.of(typed) is typed
    assert RunMeta.of({"stop": "eos"}).stop == "eos"
    assert RunMeta.of(None) == RunMeta()
