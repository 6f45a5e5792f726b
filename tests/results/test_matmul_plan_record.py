"""The CPU's matmul plan as a run records it, typed: read back key for key, and nothing made of a record that is
not one."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.results.matmul_plan_record import MatmulChoiceRecord, MatmulPlanRecord
from kvbench.results.run_meta import RunMeta

CPU_RUN = Path(__file__).resolve().parents[1] / "report" / "data" / "article-interleaved-a.json"


def test_a_recorded_plan_round_trips_byte_for_byte():
    recorded = json.loads(CPU_RUN.read_text())["meta"]["cpu_matmuls"]
    plan = MatmulPlanRecord.recorded(recorded)
    assert plan is not None and json.dumps(plan.to_json()) == json.dumps(recorded)
    assert plan.threads == 1 and plan.dtype == "fp32" and "qkv_proj" in plan.weights
    choice = plan.weights["qkv_proj"]
    assert choice.shape == [128, 64] and len(choice.rows) == len(choice.paths)
    assert choice.timings_us["1"]["plain"] == 2.4
    assert RunMeta.from_json(json.loads(CPU_RUN.read_text())["meta"]).cpu_matmuls == plan


def test_no_plan_where_the_run_recorded_none_or_something_else():
    assert MatmulPlanRecord.recorded(None) is None
    assert MatmulPlanRecord.recorded({"threads": 2}) is None
    assert MatmulPlanRecord.recorded({"weights": ["qkv_proj"]}) is None
    assert RunMeta.from_json({}).cpu_matmuls is None


def test_a_partial_record_keeps_what_it_holds():
    plan = MatmulPlanRecord.recorded({"weights": {"o_proj": {"shape": [4, 4]}, "broken": "x"}})
    assert plan is not None and (plan.threads, plan.dtype, plan.source) == (None, None, None)
    assert plan.weights == {"o_proj": MatmulChoiceRecord(shape=[4, 4])}
    skipped = MatmulChoiceRecord.from_json({"timings_us": {"1": {"plain": 3.0}, "16": "not measured"}})
    assert skipped.timings_us == {"1": {"plain": 3.0}}
