"""A run's meta typed for its readers: the record kept key for key, the typed fields read with the defaults its
readers assume where a run did not record them."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.results.dataset_draw import DatasetDraw
from kvbench.results.dataset_result import DatasetMeta
from kvbench.results.fleet_meta import FleetMeta
from kvbench.results.run_meta import RunMeta, run_meta
from kvbench.results.share_result import ShareMeta
from kvbench.results.waste_study import WasteMeta

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
    assert (meta.simulated, meta.interrupted, meta.dataset) == (False, False, None)
    assert meta.command is None and meta.kvbench_version is None and meta.host is None and meta.packages == {}
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
    assert meta.dataset == DatasetDraw("x")
    assert RunMeta.from_json({"model_name": None}).model_name == "None"  # recorded, shown as the title shows it


def test_what_every_run_records_is_typed():
    fresh = RunMeta.from_json(run_meta(seed=3))
    assert fresh.command is not None and fresh.command.startswith("kvbench")
    assert fresh.kvbench_version and fresh.python_version and fresh.platform and fresh.created_utc
    assert fresh.packages == run_meta()["packages"] and fresh.seed == 3
    assert fresh.host is not None and fresh.host.cores == run_meta()["host"].get("cores")


def test_every_kinds_meta_is_a_run_meta_that_gives_its_record_back():
    record = run_meta(model_name="tiny", max_len=64, stop="eos", kind="beam", note="n", instances=2)
    for kind in (RunMeta, WasteMeta, DatasetMeta, ShareMeta, FleetMeta):
        meta = kind.from_json(record)
        assert isinstance(meta, RunMeta) and json.dumps(meta.to_json()) == json.dumps(record)
        assert meta.model_name == "tiny" and meta.max_len == 64 and meta.stop == "eos"
    assert ShareMeta.from_json(record).kind == "beam" and FleetMeta.from_json(record).instances == 2
    assert DatasetMeta.from_json(record).note == "n"


def test_the_waste_studys_model_is_named_by_its_shape_record():
    meta = WasteMeta.from_json({"model": {"name": "llama-2-13b", "dtype": "float16"}})
    assert meta.model_name == "llama-2-13b" and meta.model_dtype == "float16"
    assert DatasetMeta.from_json({"model": "gpt2"}).model_name is None  # a tokenizer's model names no run model


def test_the_batch_cap_reads_as_recorded_and_256_where_not_recorded():
    assert RunMeta.from_json({"max_num_seqs": 64}).max_num_seqs == 64
    assert RunMeta.from_json({}).max_num_seqs == RunMeta().max_num_seqs == 256
    assert RunMeta.from_json({"max_num_seqs": "many"}).max_num_seqs == 256
