"""Opt-in: a real GGUF checkpoint (SmolLM2-135M-Instruct, see the README) end to end. Skipped unless the
environment variable KVBENCH_REAL_GGUF names the file; the test suite itself never downloads anything.

    KVBENCH_REAL_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf python -m pytest tests/models/test_real_gguf.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kvbench.engine.config import EngineConfig
from kvbench.engine.sampling import SamplingParams

REAL = os.environ.get("KVBENCH_REAL_GGUF")
pytestmark = pytest.mark.skipif(
    not REAL or not Path(REAL).is_file(), reason="set KVBENCH_REAL_GGUF to a real GGUF file to run this test"
)


@pytest.fixture(scope="module")
def loaded():
    pytest.importorskip("gguf")
    from kvbench.studies.local_model import load_model

    return load_model(REAL, "cpu", max_len=1024)


def test_the_real_checkpoint_answers_like_transformers_and_stops_at_eos(loaded):
    from kvbench.studies.local_model import build_engine

    assert loaded.can_stop_at_eos and loaded.tokenizer.chat_template
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    ids = loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        reference = loaded.model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids) :]
    for engine in ("paged", "contiguous"):
        llm = build_engine(loaded, EngineConfig(engine=engine, block_size=16, num_blocks=256, max_len=1024))
        tokens = llm.generate([ids], SamplingParams(max_tokens=48))[0]
        assert tokens == reference.tolist()[: len(tokens)]
        assert tokens[-1] in loaded.stop_token_ids and len(tokens) < 48  # the model decided where to stop
    assert "Paris" in loaded.tokenizer.decode(tokens)
