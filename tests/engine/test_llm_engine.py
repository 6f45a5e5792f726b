"""The tensor engine against ``transformers`` ``generate()``: same weights, same tokens, every KV layout.

Both engines (paged, contiguous) must emit exactly the greedy tokens of the reference for a batch of prompts
of different lengths, whatever the block size, with GQA and MHA shapes, under preemption and recompute, and
under admission limits; every run must give every block back and account its memory sanely.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import Request, RequestStatus, make_request
from kvbench.engine.result import RunResult
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.models.hf_model import build_random_model
from kvbench.models.shapes import ModelShape
from kvbench.studies.kv_budget import size_pool
from kvbench.studies.local_model import load_model

PROMPT_LENS = (5, 17, 33, 8, 1, 12)
MAX_TOKENS = 12
MAX_LEN = 48  # longest prompt + MAX_TOKENS fits
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)

SHAPES = {
    "gqa": ModelShape(
        "test-gqa",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        vocab_size=256,
        dtype="fp32",
    ),
    "mha": ModelShape(
        "test-mha",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=4,
        intermediate_size=128,
        vocab_size=256,
        dtype="fp32",
    ),
}


@dataclass
class Reference:
    model: object
    prompts: list[list[int]]
    tokens: list[list[int]]  # greedy transformers generate(), MAX_TOKENS per prompt


def _reference(shape: ModelShape, seed: int) -> Reference:
    model = build_random_model(shape, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    prompts = [torch.randint(0, shape.vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENS]
    prompts[1][3] = 0  # token 0 is generate()'s pad id: an explicit attention mask keeps it a real token
    tokens = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_TOKENS,
                min_new_tokens=MAX_TOKENS,
                do_sample=False,
            )
            tokens.append(out[0, len(prompt) :].tolist())
    return Reference(model, prompts, tokens)


@pytest.fixture(scope="module")
def refs() -> dict[str, Reference]:
    return {"gqa": _reference(SHAPES["gqa"], seed=0), "mha": _reference(SHAPES["mha"], seed=1)}


def _requests(prompts, params) -> list[Request]:
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    return [make_request(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]


def _run(engine: LLMEngine, requests: list[Request], concurrency: int) -> tuple[RunResult, object]:
    """Run and check what every run must satisfy; returns the result and the run's scheduler."""
    seen = {}
    result = engine.run(requests, concurrency, on_step=lambda _name, scheduler, _done: seen.setdefault("s", scheduler))
    scheduler = seen["s"]
    # run() raises if a block leaked; the pool is also back to all-free with consistent extents / tables
    assert scheduler.manager.pool.num_free == engine.config.num_blocks
    assert not scheduler.running and not scheduler.waiting
    # every request ended exactly once: finished or rejected
    ended = [r.request_id for r in scheduler.finished] + [r.request_id for r in scheduler.rejected]
    assert sorted(ended) == sorted(r.request_id for r in requests)
    for request in requests:
        assert request.status in (RequestStatus.FINISHED, RequestStatus.REJECTED)
        if request.status is RequestStatus.FINISHED:
            assert len(request.output_token_ids) == request.num_outputs == len(request.token_times)
            assert request.final_kv_len == request.prompt_len + request.num_outputs - 1
        else:
            assert request.reject_reason and not request.output_token_ids
    # accounting: the parts of the pool add to 100 %, token states were held
    waste = result.accountant.waste_pct()
    assert sum(waste.values()) == pytest.approx(100.0)
    if result.completed:
        assert waste["token_state_pct"] > 0
        assert result.throughput()["output_throughput"] > 0
    return result, scheduler


def _config(engine: str, block_size: int, num_blocks: int | None = None, **changes) -> EngineConfig:
    if num_blocks is None:
        num_blocks = len(PROMPT_LENS) * -(-MAX_LEN // block_size)  # room for every request at max-len
    return EngineConfig(engine=engine, block_size=block_size, num_blocks=num_blocks, max_len=MAX_LEN, **changes)


# ------------------------------------------------------------------------------------------ greedy = generate()


@pytest.mark.parametrize("shape", ["gqa", "mha"])
@pytest.mark.parametrize("block_size", [1, 7, 16])
@pytest.mark.parametrize("engine", ["paged", "contiguous"])
def test_greedy_tokens_equal_transformers_generate(refs, engine, block_size, shape):
    ref = refs[shape]
    llm = LLMEngine(ref.model, _config(engine, block_size))
    requests = _requests(ref.prompts, GREEDY)
    result, _ = _run(llm, requests, concurrency=len(requests))
    assert [r.output_token_ids for r in requests] == ref.tokens
    assert result.num_preemptions == 0
    assert result.peak_running == len(requests)
    assert [r.stop_reason for r in requests] == ["length"] * len(requests)


@pytest.mark.parametrize(
    ("shape", "block_size", "num_blocks"),
    [
        ("gqa", 1, 48),
        ("gqa", 7, 8),
        ("gqa", 16, 3),
        ("mha", 7, 7),
    ],
)
def test_paged_preempts_and_recomputes_to_the_same_tokens(refs, shape, block_size, num_blocks):
    ref = refs[shape]
    llm = LLMEngine(ref.model, _config("paged", block_size, num_blocks))
    requests = _requests(ref.prompts, GREEDY)
    result, _ = _run(llm, requests, concurrency=len(requests))
    assert result.num_preemptions > 0
    assert sum(r.num_preemptions for r in requests) == result.num_preemptions
    assert [r.output_token_ids for r in requests] == ref.tokens


def test_generate_api_matches_reference(refs):
    ref = refs["gqa"]
    llm = LLMEngine(ref.model, _config("paged", 16))
    assert llm.generate(ref.prompts, GREEDY) == ref.tokens


# ------------------------------------------------------------------------------------------ contiguous admission


def _contiguous_too_small(admission: str) -> EngineConfig:
    # max reservation: MAX_LEN slots = 6 blocks of 8 per request; 13 blocks hold two slabs at a time
    return _config("contiguous", 8, num_blocks=13, reserve="max", admission=admission)


def test_contiguous_queue_mode_completes_everything_within_the_budget(refs):
    ref = refs["gqa"]
    llm = LLMEngine(ref.model, _contiguous_too_small("queue"))
    requests = _requests(ref.prompts * 2, GREEDY)
    result, _ = _run(llm, requests, concurrency=6)
    assert len(result.completed) == len(requests) and not result.rejected
    assert result.peak_running == 2
    assert result.num_preemptions == 0
    assert [r.output_token_ids for r in requests] == ref.tokens * 2


def test_contiguous_reject_mode_rejects_as_oom_and_keeps_the_rest_correct(refs):
    ref = refs["gqa"]
    llm = LLMEngine(ref.model, _contiguous_too_small("reject"))
    requests = _requests(ref.prompts * 2, GREEDY)
    result, _ = _run(llm, requests, concurrency=6)
    assert result.rejected and result.completed
    assert len(result.rejected) + len(result.completed) == len(requests)
    assert all(r.reject_reason.startswith("oom") for r in result.rejected)
    assert result.peak_running <= 2
    expected = ref.tokens * 2
    for request in result.completed:
        assert request.output_token_ids == expected[request.request_id]


# ------------------------------------------------------------------------------------------ sampling


def test_seeded_sampling_is_reproducible_across_runs_and_batch_composition(refs):
    ref = refs["gqa"]
    params = [
        SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=100 + i, max_tokens=MAX_TOKENS, ignore_eos=True)
        for i in range(len(ref.prompts))
    ]
    outputs = []
    for engine, concurrency, num_blocks in [
        ("paged", 6, None),
        ("paged", 6, None),
        ("paged", 1, None),
        ("contiguous", 3, None),
        ("paged", 6, 8),
    ]:
        llm = LLMEngine(ref.model, _config(engine, 7, num_blocks))
        requests = _requests(ref.prompts, params)
        _run(llm, requests, concurrency)
        outputs.append([r.output_token_ids for r in requests])
    assert all(out == outputs[0] for out in outputs[1:])
    assert outputs[0] != ref.tokens  # it did sample
    # another seed, another stream
    other = [
        SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=200 + i, max_tokens=MAX_TOKENS, ignore_eos=True)
        for i in range(len(ref.prompts))
    ]
    llm = LLMEngine(ref.model, _config("paged", 7))
    assert llm.generate(ref.prompts, other) != outputs[0]


def test_greedy_and_sampled_requests_share_a_batch(refs):
    ref = refs["gqa"]
    sampled = SamplingParams(temperature=1.0, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True)
    params = [GREEDY if i % 2 == 0 else sampled for i in range(len(ref.prompts))]
    llm = LLMEngine(ref.model, _config("paged", 16))
    out = llm.generate(ref.prompts, params)
    assert [out[i] for i in range(0, len(out), 2)] == [ref.tokens[i] for i in range(0, len(out), 2)]


# ------------------------------------------------------------------------------------------ EOS


def _eos_choice(ref: Reference) -> tuple[int, int]:
    """(prompt index, token) where the token first appears as the 4th greedy output (step 3)."""
    for index, tokens in enumerate(ref.tokens):
        if tokens[3] not in tokens[:3]:
            return index, tokens[3]
    raise AssertionError("no prompt whose 4th greedy token is new")


def _truncate_at(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.mark.parametrize("engine", ["paged", "contiguous"])
def test_request_stops_at_eos_unless_ignore_eos(refs, engine):
    ref = refs["gqa"]
    index, eos = _eos_choice(ref)
    llm = LLMEngine(ref.model, _config(engine, 1, reserve="oracle"))
    with_eos = _requests(ref.prompts, SamplingParams(max_tokens=MAX_TOKENS, eos_token_id=eos))
    result_eos, _ = _run(llm, with_eos, len(with_eos))
    assert [r.output_token_ids for r in with_eos] == [_truncate_at(t, eos) for t in ref.tokens]
    stopped = with_eos[index]
    assert stopped.output_token_ids == ref.tokens[index][:4]
    assert stopped.stop_reason == "eos"
    assert stopped.num_outputs == 4
    assert stopped.final_kv_len == stopped.prompt_len + 3 < stopped.expected_kv_len

    ignoring = _requests(ref.prompts, SamplingParams(max_tokens=MAX_TOKENS, eos_token_id=eos, ignore_eos=True))
    result_all, _ = _run(llm, ignoring, len(ignoring))
    assert [r.output_token_ids for r in ignoring] == ref.tokens
    assert all(r.final_kv_len == r.expected_kv_len for r in ignoring)
    # hindsight: slots reserved for tokens never written are internal waste, not reservation
    if engine == "contiguous":  # oracle reservation at block size 1 wastes nothing when requests run to the end
        assert result_all.accountant.waste_pct()["internal_pct"] == pytest.approx(0.0, abs=1e-9)
        assert result_eos.accountant.waste_pct()["internal_pct"] > 0
    else:  # paged holds what it wrote: no internal waste either way at block size 1
        assert result_eos.accountant.waste_pct()["internal_pct"] == pytest.approx(0.0, abs=1e-9)


def test_model_eos_applies_when_params_name_none(refs):
    ref = refs["gqa"]
    index, eos = _eos_choice(ref)
    llm = LLMEngine(ref.model, _config("paged", 7), eos_token_id=eos)
    out = llm.generate(ref.prompts, SamplingParams(max_tokens=MAX_TOKENS))
    assert out == [_truncate_at(t, eos) for t in ref.tokens]
    assert len(out[index]) == 4


# ------------------------------------------------------------------------------------------ bad input


def test_prompt_longer_than_max_len_is_rejected_and_the_others_run(refs):
    ref = refs["gqa"]
    llm = LLMEngine(ref.model, _config("paged", 7))
    prompts = [*ref.prompts[:2], list(range(MAX_LEN + 3)), *ref.prompts[2:]]
    requests = _requests(prompts, GREEDY)
    result, _ = _run(llm, requests, concurrency=3)
    too_long = requests[2]
    assert too_long.status is RequestStatus.REJECTED
    assert "exceeds max-len" in too_long.reject_reason
    assert [r.output_token_ids for r in requests if r is not too_long] == ref.tokens
    assert len(result.completed) == len(ref.prompts)
    with pytest.raises(KvbenchError, match="rejected"):
        llm.generate(prompts, GREEDY)


def test_request_bigger_than_the_whole_pool_is_rejected(refs):
    ref = refs["gqa"]
    llm = LLMEngine(ref.model, _config("paged", 4, num_blocks=10))  # 40 slots; the 33-token prompt needs 44
    requests = _requests(ref.prompts, GREEDY)
    _run(llm, requests, concurrency=len(requests))
    assert requests[2].status is RequestStatus.REJECTED
    assert "whole pool" in requests[2].reject_reason
    assert [r.output_token_ids for r in requests if r.request_id != 2] == ref.tokens[:2] + ref.tokens[3:]


def test_budget_without_a_single_block_is_a_clear_error():
    shape = SHAPES["gqa"]
    with pytest.raises(KvbenchError, match="no block"):  # 15 token slots of KV memory: not one block of 16
        size_pool(
            EngineConfig(block_size=16),
            shape.bytes_per_token,
            (shape.bytes_per_token * 15, "15 slots"),
            lambda: (0, "unused"),
        )
    with pytest.raises(KvbenchError, match="no block"):
        EngineConfig(num_blocks=0)
    with pytest.raises(KvbenchError, match="block size"):
        EngineConfig(block_size=0)
    with pytest.raises(KvbenchError, match="unknown engine"):
        EngineConfig(engine="vllm")


def test_unsupported_architecture_is_a_clear_error():
    with pytest.raises(KvbenchError, match="Llama-family"):
        load_model("opt-13b", device="cpu")


def test_missing_or_invalid_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(KvbenchError, match="no such path"):
        load_model(str(tmp_path / "nowhere"), device="cpu")
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 256,
            }
        )
    )
    with pytest.raises(KvbenchError, match="safetensors"):
        load_model(str(tmp_path), device="cpu")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(KvbenchError, match="malformed config"):
        load_model(str(tmp_path), device="cpu")


# ------------------------------------------------------------------------------------------ prefix caching


def _shared_prefix_reference(ref: Reference) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts that share a 21-token prefix (a system prompt) and their greedy generate() tokens."""
    generator = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, 256, (21,), generator=generator).tolist()
    prompts = [prefix + torch.randint(0, 256, (n,), generator=generator).tolist() for n in (3, 9, 1, 14, 6)]
    tokens = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = ref.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_TOKENS,
                min_new_tokens=MAX_TOKENS,
                do_sample=False,
            )
            tokens.append(out[0, len(prompt) :].tolist())
    return prompts, tokens


@pytest.mark.parametrize(("block_size", "num_blocks", "concurrency"), [(4, 60, 1), (7, 40, 1), (4, 60, 2), (4, 14, 5)])
def test_prefix_cache_hits_compute_only_the_suffix_and_tokens_equal_generate(refs, block_size, num_blocks, concurrency):
    """A later request with the same prefix reuses the cached blocks (its prefill runs only the uncached suffix);
    a preempted request recomputes on top of its own cached prompt blocks. Tokens are generate()'s all the same."""
    ref = refs["gqa"]
    prompts, tokens = _shared_prefix_reference(ref)
    llm = LLMEngine(ref.model, _config("paged", block_size, num_blocks, enable_prefix_caching=True))
    requests = _requests(prompts, GREEDY)
    result, scheduler = _run(llm, requests, concurrency=concurrency)
    assert [r.output_token_ids for r in requests] == tokens
    assert scheduler.cached_tokens > 0 and scheduler.manager.prefix_hits > 0
    assert scheduler.cached_tokens % block_size == 0 and scheduler.cached_tokens < scheduler.prefill_tokens
    if num_blocks == 14:
        assert result.num_preemptions > 0


def test_without_prefix_caching_nothing_is_reused(refs):
    ref = refs["gqa"]
    prompts, tokens = _shared_prefix_reference(ref)
    llm = LLMEngine(ref.model, _config("paged", 4, 60))
    requests = _requests(prompts, GREEDY)
    _result, scheduler = _run(llm, requests, concurrency=1)
    assert [r.output_token_ids for r in requests] == tokens
    assert scheduler.cached_tokens == 0 and scheduler.prefill_tokens == sum(len(p) for p in prompts)
