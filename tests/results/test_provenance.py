"""A run's provenance from any kind's meta: the shape typed, the threads through RunMeta's rule, the display rules
that differ from RunMeta's on purpose."""

from __future__ import annotations

from kvbench.results.model_shape_facts import ModelShapeFacts
from kvbench.results.provenance import Provenance


def test_the_shape_reads_typed_from_model_shape_or_the_model_record():
    made = Provenance.from_meta({"model": {"name": "tiny", "num_layers": 2, "dtype": "fp32"}})
    assert made.shape == ModelShapeFacts(num_layers=2, dtype="fp32", name="tiny") and made.model_name == "tiny"
    assert Provenance.from_meta({"model_shape": {}, "model": {}}).shape is None


def test_threads_show_only_with_their_reason_and_as_a_whole_count():
    assert Provenance.from_meta({"threads": {"threads": 8.0, "reason": "set by the user"}}).threads == 8
    assert Provenance.from_meta({"threads": {"threads": 0, "reason": "x"}}).threads is None
    assert Provenance.from_meta({"threads": {"threads": True, "reason": "x"}}).threads is None
    assert Provenance.from_meta({"threads": 8}).threads is None  # a bare count has no reason to show


def test_the_display_rules_that_differ_from_run_meta():
    assert Provenance.from_meta({"gpu": "a100-80g"}).device == "a100-80g"
    assert Provenance.from_meta({"device": None, "gpu": "a100-80g"}).device == "a100-80g"
    assert Provenance.from_meta({"model": "gpt2"}).model_name == "gpt2"  # a dataset's tokenizer
    assert Provenance.from_meta({"model_name": "", "model": {"name": "tiny"}}).model_name == "tiny"
