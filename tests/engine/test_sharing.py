"""Parallel sampling and beam search with shared blocks: same outputs as without sharing, fewer blocks,
copy-on-write keeps other sequences intact, and beams equal transformers' beam search."""

from __future__ import annotations

import pytest
import torch

from kvbench.engine.beam import BeamSearch
from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.kv.block_pool import BlockPool
from kvbench.kv.paged import PagedManager
from kvbench.models.hf_model import build_random_model
from kvbench.models.runner import ModelRunner
from kvbench.models.shapes import ModelShape
from kvbench.studies.share import beam_search, make_prompts, parallel_sampling, savings

SHAPE = ModelShape(
    "share-test",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    vocab_size=256,
    dtype="fp32",
)


@pytest.fixture(scope="module")
def model():
    built = build_random_model(SHAPE, seed=3)
    built.generation_config.eos_token_id = None
    return built


def _prompts(seed: int, lengths=(11, 20, 7)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, SHAPE.vocab_size, (n,), generator=g).tolist() for n in lengths]


def _params(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.9, top_k=50, top_p=0.95, seed=seed, max_tokens=12, ignore_eos=True)


def test_parallel_samples_are_identical_with_and_without_sharing_and_use_fewer_blocks(model):
    prompts, n = _prompts(1), 4
    engine = LLMEngine(model, EngineConfig(engine="paged", block_size=4, num_blocks=200, max_len=64))
    shared = engine.run([make_request(g, p, _params(100 * g), num_samples=n) for g, p in enumerate(prompts)], 3)
    unshared_requests = [
        make_request(10 * g + i, p, _params(100 * g + i)) for g, p in enumerate(prompts) for i in range(n)
    ]
    unshared = engine.run(unshared_requests, len(unshared_requests))
    got = {
        ((r.parent_id if r.parent_id is not None else r.request_id), r.sample_index): r.output_token_ids
        for r in shared.requests
    }
    want = {(r.request_id // 10, r.request_id % 10): r.output_token_ids for r in unshared.requests}
    assert got == want and len(got) == len(prompts) * n
    assert len({tuple(v) for v in got.values()}) > len(prompts)  # the samples do differ from each other
    assert shared.accountant.peak_allocated < unshared.accountant.peak_allocated
    shares = shared.accountant.shares_pct()  # shared slots counted once: the parts still add up to the pool
    assert sum(shares.as_dict().values()) == pytest.approx(100.0)
    assert shared.accountant.peak.used < unshared.accountant.peak.used  # the prompt is stored once
    assert all(value >= 0 for value in shared.accountant.slot_seconds.as_dict().values())


def test_parallel_sampling_under_preemption_still_matches(model):
    prompts, n = _prompts(2, (9, 14)), 3
    tight = LLMEngine(model, EngineConfig(engine="paged", block_size=4, num_blocks=14, max_len=64))
    result = tight.run([make_request(g, p, _params(7 * g), num_samples=n) for g, p in enumerate(prompts)], 2)
    roomy = LLMEngine(model, EngineConfig(engine="paged", block_size=4, num_blocks=200, max_len=64))
    reference = roomy.run([make_request(g, p, _params(7 * g), num_samples=n) for g, p in enumerate(prompts)], 2)
    assert result.num_preemptions > 0
    key = lambda r: ((r.parent_id if r.parent_id is not None else r.request_id), r.sample_index)  # noqa: E731
    assert {key(r): r.output_token_ids for r in result.requests} == {
        key(r): r.output_token_ids for r in reference.requests
    }


def test_copy_on_write_gives_the_writer_a_private_block_and_leaves_the_other_intact(model):
    runner = ModelRunner(model, num_blocks=16, block_size=4)
    manager = PagedManager(BlockPool(16, 4))
    prompt = _prompts(4, (6,))[0]
    manager.allocate(1, len(prompt))
    runner.forward(runner.build_step([(prompt, 0, manager.block_table(1))]))
    manager.fork(1, 2)
    shared_last = manager.block_table(1)[-1]
    before = [cache[shared_last].clone() for cache in runner.k_caches]
    copies = manager.ensure_capacity(2, len(prompt) + 1)  # the child writes into the shared, partly filled block
    assert [(c.src, c.dst) for c in copies] == [(shared_last, manager.block_table(2)[-1])]
    from kvbench.kernels import copy_blocks

    copy_blocks(runner.k_caches, runner.v_caches, torch.tensor([copies[0].src]), torch.tensor([copies[0].dst]))
    runner.forward(runner.build_step([([prompt[-1]], len(prompt), manager.block_table(2))]))
    for layer, cache in enumerate(runner.k_caches):
        assert torch.equal(cache[shared_last], before[layer])  # the parent's block is untouched
        child = cache[manager.block_table(2)[-1]]
        assert torch.equal(child[:2], before[layer][:2])  # the copy carries the shared tokens
        assert not torch.equal(child[2], before[layer][2])  # and then got the child's own token
    assert manager.block_table(1)[:1] == manager.block_table(2)[:1]  # full blocks stay shared
    manager.free(1)
    manager.free(2)
    manager.check_invariants()
    assert manager.pool.num_used == 0


@pytest.mark.parametrize("width, steps, length_penalty", [(3, 8, 1.0), (4, 10, 0.5)])
def test_beam_search_equals_transformers(model, width, steps, length_penalty):
    prompt = _prompts(5, (13,))[0]
    out = model.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        num_beams=width,
        num_return_sequences=width,
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        length_penalty=length_penalty,
        output_scores=True,
        return_dict_in_generate=True,
    )
    want = [s[len(prompt) :].tolist() for s in out.sequences]
    runner = ModelRunner(model, num_blocks=64, block_size=4)
    for mode in ("paged-shared", "paged-copy", "contiguous"):
        result = BeamSearch(runner, mode, max_len=64).run(prompt, width, steps, length_penalty)
        assert result.sequences == want, mode
        assert result.scores == pytest.approx(out.sequences_scores.tolist(), abs=1e-4), mode


def test_sharing_saves_blocks_for_beams_and_samples(model):
    config = EngineConfig(block_size=4, num_blocks=400, max_len=64, reserve="oracle")
    prompts = make_prompts(3, 16, SHAPE.vocab_size, seed=0)
    runner = ModelRunner(model, num_blocks=400, block_size=4)
    beams = beam_search(runner, config, prompts, 4, 8, SHAPE.bytes_per_token)
    singles = beam_search(runner, config, prompts, 1, 8, SHAPE.bytes_per_token)
    by_mode = {m.mode: m for m in beams}
    assert by_mode["paged-shared"].outputs == by_mode["paged-copy"].outputs == by_mode["contiguous"].outputs
    ratios = savings(beams, singles)
    assert ratios.saved_pct_mean is not None and 0 < ratios.saved_pct_mean < 100
    assert ratios.costs["paged-shared"].mean < ratios.costs["paged-copy"].mean
    samples = parallel_sampling(model, config, prompts, 3, 8, 0, SHAPE.bytes_per_token)
    by_mode = {m.mode: m for m in samples}
    assert by_mode["paged-shared"].outputs == by_mode["paged-unshared"].outputs == by_mode["contiguous"].outputs
    assert by_mode["paged-shared"].mean_blocks < by_mode["paged-unshared"].mean_blocks
