"""The model runner against transformers: greedy tokens equal ``generate()`` token for token (fp32, CPU)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from kvbench.models.hf_model import build_random_model, round_weights_to_bf16_
from kvbench.models.runner import ModelRunner, _fused_bias, fuse_rows, kv_bytes_per_block
from kvbench.models.shapes import ModelShape

GQA = ModelShape(
    "test-gqa",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    vocab_size=384,
    max_position_embeddings=256,
    dtype="fp32",
)
MHA = ModelShape(
    "test-mha",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=4,
    intermediate_size=96,
    vocab_size=320,
    max_position_embeddings=256,
    dtype="fp32",
    tie_word_embeddings=True,
)
SHAPES = {"gqa": GQA, "mha": MHA}
PROMPT_LENS = (5, 13, 9)
NEW_TOKENS = 24
NUM_BLOCKS = 128


class BlockCounter:
    """A tiny allocator for tests: hands out fresh block ids in a shuffled order."""

    def __init__(self, num_blocks: int = NUM_BLOCKS, seed: int = 0) -> None:
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def take(self, num_tokens: int, block_size: int) -> list[int]:
        return [self.free.pop() for _ in range(-(-num_tokens // block_size))]


def make_prompts(vocab: int, lens: tuple[int, ...] = PROMPT_LENS) -> list[list[int]]:
    rng = random.Random(1234)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lens]


_MODELS: dict[str, object] = {}
_GREEDY: dict[str, list[list[int]]] = {}


def model_for(shape: ModelShape):
    """One random model per shape name (seed 7), shared by the tests of this module."""
    if shape.name not in _MODELS:
        _MODELS[shape.name] = build_random_model(shape, seed=7)
    return _MODELS[shape.name]


def hf_greedy(shape: ModelShape) -> list[list[int]]:
    if shape.name not in _GREEDY:
        _GREEDY[shape.name] = _generate(shape, NEW_TOKENS)
    return _GREEDY[shape.name]


def _generate(shape: ModelShape, num_new: int, model=None) -> list[list[int]]:
    """Reference tokens: ``generate()`` one prompt at a time (no padding), no EOS stopping; ``model`` defaults to
    the shape's shared one."""
    model = model or model_for(shape)
    outputs = []
    for prompt in make_prompts(shape.vocab_size):
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=num_new,
            min_new_tokens=num_new,
            eos_token_id=None,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def runner_greedy(runner: ModelRunner, prompts: list[list[int]], num_new: int, blocks: BlockCounter) -> list[list[int]]:
    """Prefill every prompt in one batched step, then decode all requests in batched steps."""
    bs = runner.block_size
    tables = [blocks.take(len(p) + num_new, bs) for p in prompts]
    logits = runner.forward(runner.build_step([(p, 0, t) for p, t in zip(prompts, tables, strict=True)]))
    outputs = [[token] for token in logits.argmax(-1).tolist()]
    for _ in range(num_new - 1):
        chunks = [([o[-1]], len(p) + len(o) - 1, t) for p, o, t in zip(prompts, outputs, tables, strict=True)]
        step = runner.build_step(chunks)
        assert step.is_decode
        for out, token in zip(outputs, runner.forward(step).argmax(-1).tolist(), strict=True):
            out.append(token)
    return outputs


@pytest.mark.parametrize("backend", [None, "torch"])  # the CPU default (C kernels where they build) and torch
@pytest.mark.parametrize("block_size", [1, 7, 16])
@pytest.mark.parametrize("kind", ["gqa", "mha"])
def test_greedy_matches_transformers_generate(kind: str, block_size: int, backend: str | None) -> None:
    shape = SHAPES[kind]
    runner = ModelRunner(
        model_for(shape), num_blocks=NUM_BLOCKS * 2 // block_size + 16, block_size=block_size, kernel_backend=backend
    )
    assert runner.native_ops == (runner.kernel_backend == "native")  # one switch for the C attention and ops
    outputs = runner_greedy(runner, make_prompts(shape.vocab_size), NEW_TOKENS, BlockCounter(runner.num_blocks))
    expected = hf_greedy(shape)
    assert outputs == expected
    assert any(len(set(out)) > NEW_TOKENS // 2 for out in outputs)  # the random model is not degenerate


@pytest.mark.parametrize("kind", ["gqa", "mha"])
def test_reference_tokens_vary_between_prompts(kind: str) -> None:
    tokens = hf_greedy(SHAPES[kind])
    assert len({tuple(t[:4]) for t in tokens}) == len(tokens)


def test_recompute_after_dropping_blocks_continues_identically() -> None:
    """Generate, throw one request's blocks away (poisoned with NaN), re-prefill it elsewhere, go on."""
    shape, bs, first = GQA, 7, 10
    runner = ModelRunner(model_for(shape), num_blocks=64, block_size=bs)
    blocks = BlockCounter(64, seed=3)
    prompts = make_prompts(shape.vocab_size)
    partial = runner_greedy(runner, prompts, first, blocks)
    tables = [blocks.take(len(p) + NEW_TOKENS, bs) for p in prompts]  # the old blocks are gone for good
    for k_cache, v_cache in zip(runner.k_caches, runner.v_caches, strict=True):
        used = torch.tensor(sorted(set(range(64)) - set(blocks.free) - {b for t in tables for b in t}))
        k_cache[used] = float("nan")
        v_cache[used] = float("nan")
    # one mixed step: every request re-prefills its prompt and generated tokens into its new blocks
    step = runner.build_step([(p + o, 0, t) for p, o, t in zip(prompts, partial, tables, strict=True)])
    outputs = [o + [tok] for o, tok in zip(partial, runner.forward(step).argmax(-1).tolist(), strict=True)]
    while len(outputs[0]) < NEW_TOKENS:
        chunks = [([o[-1]], len(p) + len(o) - 1, t) for p, o, t in zip(prompts, outputs, tables, strict=True)]
        for out, token in zip(outputs, runner.forward(runner.build_step(chunks)).argmax(-1).tolist(), strict=True):
            out.append(token)
    assert outputs == hf_greedy(shape)


def test_recompute_one_request_mixed_with_decodes() -> None:
    """A preempted request re-prefills in the same step as the others' decodes (a mixed step)."""
    shape, bs, first = MHA, 16, 8
    runner = ModelRunner(model_for(shape), num_blocks=32, block_size=bs)
    blocks = BlockCounter(32, seed=5)
    prompts = make_prompts(shape.vocab_size)
    outputs = runner_greedy(runner, prompts, first, blocks)
    tables = [blocks.take(len(p) + NEW_TOKENS, bs) for p in prompts]
    chunks = [(prompts[0] + outputs[0], 0, tables[0])]  # request 0 recomputed in new blocks
    chunks += [([o[-1]], len(p) + len(o) - 1, t) for p, o, t in zip(prompts[1:], outputs[1:], tables[1:], strict=True)]
    # requests 1 and 2 keep their old blocks: copy them into their new tables first
    old = BlockCounter(32, seed=5)
    old_tables = [old.take(len(p) + first, bs) for p in prompts]
    for b in (1, 2):
        src = torch.tensor(old_tables[b])
        dst = torch.tensor(tables[b][: len(old_tables[b])])
        for cache in (*runner.k_caches, *runner.v_caches):
            cache[dst] = cache[src]
    step = runner.build_step(chunks)
    assert not step.is_decode
    for out, token in zip(outputs, runner.forward(step).argmax(-1).tolist(), strict=True):
        out.append(token)
    while len(outputs[0]) < NEW_TOKENS:
        chunks = [([o[-1]], len(p) + len(o) - 1, t) for p, o, t in zip(prompts, outputs, tables, strict=True)]
        for out, token in zip(outputs, runner.forward(runner.build_step(chunks)).argmax(-1).tolist(), strict=True):
            out.append(token)
    assert outputs == hf_greedy(shape)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_chunk_after_cached_prefix_equals_full_prefill(block_size: int) -> None:
    shape = GQA
    runner = ModelRunner(model_for(shape), num_blocks=128, block_size=block_size)
    blocks = BlockCounter(128, seed=9)
    prompt = make_prompts(shape.vocab_size, (21,))[0]
    other = make_prompts(shape.vocab_size, (6,))[0]
    full_table = blocks.take(len(prompt), block_size)
    full = runner.forward(runner.build_step([(prompt, 0, full_table)]))
    table, other_table = blocks.take(len(prompt), block_size), blocks.take(len(other), block_size)
    runner.forward(runner.build_step([(prompt[:8], 0, table)]))
    chunked = runner.forward(runner.build_step([(other, 0, other_table), (prompt[8:], 8, table)]))
    torch.testing.assert_close(chunked[1:], full, rtol=1e-5, atol=1e-5)
    alone = runner.forward(runner.build_step([(other, 0, blocks.take(len(other), block_size))]))
    torch.testing.assert_close(chunked[:1], alone, rtol=1e-5, atol=1e-5)


def test_shared_prefix_blocks() -> None:
    """Two requests read the same full prefix blocks; each prefills only its own suffix."""
    shape, bs = MHA, 4
    runner = ModelRunner(model_for(shape), num_blocks=64, block_size=bs)
    blocks = BlockCounter(64, seed=11)
    prefix = make_prompts(shape.vocab_size, (8,))[0]
    suffixes = make_prompts(shape.vocab_size, (5, 3))
    shared = blocks.take(len(prefix), bs)
    runner.forward(runner.build_step([(prefix, 0, shared)]))
    tables = [shared + blocks.take(len(s), bs) for s in suffixes]
    logits = runner.forward(runner.build_step([(s, len(prefix), t) for s, t in zip(suffixes, tables, strict=True)]))
    for row, suffix in enumerate(suffixes):
        full = runner.forward(runner.build_step([(prefix + suffix, 0, blocks.take(len(prefix + suffix), bs))]))
        torch.testing.assert_close(logits[row : row + 1], full, rtol=1e-5, atol=1e-5)


ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("name", list(ROPE_SCALINGS))
def test_rope_scaling_generate_matches_transformers(name: str) -> None:
    # max_position_embeddings 16: prompts (< 16 tokens) grow past it, so dynamic NTK scaling engages
    shape = replace(
        GQA, name=f"gqa-{name}", rope_scaling=ROPE_SCALINGS[name], max_position_embeddings=16, rope_theta=500.0
    )
    runner = ModelRunner(model_for(shape), num_blocks=64, block_size=5)
    outputs = runner_greedy(runner, make_prompts(shape.vocab_size), NEW_TOKENS, BlockCounter(64, seed=2))
    assert outputs == hf_greedy(shape)


def test_pool_layout_and_bytes() -> None:
    runner = ModelRunner(model_for(GQA), num_blocks=10, block_size=8)
    assert len(runner.k_caches) == len(runner.v_caches) == GQA.num_layers
    assert runner.k_caches[0].shape == (10, 8, GQA.num_kv_heads, GQA.head_dim)
    assert runner.kv_pool_bytes == 10 * 8 * GQA.bytes_per_token
    assert runner.bytes_per_block * 10 == runner.kv_pool_bytes
    assert kv_bytes_per_block(model_for(GQA).config, 8, torch.float32) == runner.bytes_per_block


def test_runner_uses_the_model_parameters() -> None:
    """Fused q/k/v and gate/up share the model's storage: no second copy of the weights, values unchanged."""
    model = model_for(GQA)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    before = [p.detach().clone() for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)]
    runner = ModelRunner(model, num_blocks=4, block_size=4, packed_weights=False)
    layer = runner.layers[0]
    assert layer.qkv_proj.data_ptr() == attn.q_proj.weight.data_ptr()
    assert torch.equal(layer.qkv_proj, torch.cat(before))
    assert torch.equal(attn.k_proj.weight, before[1]) and torch.equal(attn.v_proj.weight, before[2])
    assert layer.gate_up_proj.data_ptr() == mlp.gate_proj.weight.data_ptr()
    assert runner.embed_tokens.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    second = ModelRunner(model, num_blocks=4, block_size=4, packed_weights=False)  # adjacent rows: no copy
    assert second.layers[0].qkv_proj.data_ptr() == layer.qkv_proj.data_ptr()
    assert second.layers[0].gate_up_proj.data_ptr() == layer.gate_up_proj.data_ptr()


def test_packed_weights_give_the_same_logits_and_leave_the_model_alone() -> None:
    """oneDNN-packed matmul weights (the CPU default) match plain ones; the model's tensors are untouched."""
    from kvbench.cpu import cpu_linear

    if not cpu_linear.packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN packing unavailable here")
    model = build_random_model(GQA, seed=7)  # fresh: the shared one may be packed by an earlier test
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    expected = sum(w.numel() * w.element_size() for w in {id(w): w for w in linears}.values())
    assert cpu_linear.packed_copy_bytes(model) == expected > 0
    packed = ModelRunner(model, num_blocks=8, block_size=4)
    assert cpu_linear.packed_copy_bytes(model) == 0  # packed once: later runners add nothing
    again = ModelRunner(model, num_blocks=8, block_size=4)
    assert again.layers[0].qkv_proj is packed.layers[0].qkv_proj and again.lm_head is packed.lm_head
    plain = ModelRunner(model, num_blocks=8, block_size=4, packed_weights=False)
    onednn = packed.layers[0].qkv_proj.copies[cpu_linear.ONEDNN]
    assert packed.packed_weights and onednn.packed.is_mkldnn and not plain.packed_weights
    assert packed.layers[0].qkv_proj.plain.data_ptr() == plain.layers[0].qkv_proj.data_ptr()  # not a third copy
    assert not model.model.layers[0].self_attn.q_proj.weight.is_mkldnn
    chunk = [([3, 1, 4, 1, 5], 0, [0, 1])]
    torch.testing.assert_close(
        packed.forward(packed.build_step(chunk)), plain.forward(plain.build_step(chunk)), rtol=1e-4, atol=1e-4
    )
    weight = packed.layers[0].gate_up_proj
    rows = torch.randn(300, GQA.hidden_size)
    torch.testing.assert_close(
        cpu_linear.linear(rows, weight), torch.nn.functional.linear(rows, weight.plain), rtol=1e-4, atol=1e-4
    )  # (which path takes which row count: test_cpu_choices.py)


def test_bf16_valued_weights_take_the_amx_kernel_and_keep_transformers_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights holding bfloat16 values (a published checkpoint's) run on the AMX kernel, tokens unchanged."""
    from kvbench.cpu import cpu_linear
    from kvbench.kernels import cpu_amx

    if not cpu_amx.available():
        pytest.skip(f"AMX kernel unavailable here: {cpu_amx.unavailable_reason()}")
    monkeypatch.setattr(cpu_amx, "MIN_WEIGHT_ELEMENTS", 0)  # the test shape's weights are small
    model = round_weights_to_bf16_(build_random_model(GQA, seed=7))
    linears = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}.values()
    assert cpu_linear.packed_copy_bytes(model) == sum(cpu_amx.packed_bytes(w) for w in linears)
    runner = ModelRunner(model, num_blocks=NUM_BLOCKS, block_size=16)
    weights = [
        runner.lm_head,
        *(
            getattr(layer, name)
            for layer in runner.layers
            for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
        ),
    ]
    assert all(set(w.copies) == {"AMX"} and isinstance(w.copies["AMX"], cpu_amx.AmxWeight) for w in weights)
    expected = _generate(GQA, NEW_TOKENS, model)
    outputs = runner_greedy(runner, make_prompts(GQA.vocab_size), NEW_TOKENS, BlockCounter(runner.num_blocks))
    assert outputs == expected
    unrounded = ModelRunner(build_random_model(GQA, seed=7), num_blocks=8, block_size=16)
    assert set(unrounded.layers[0].qkv_proj.copies) == {"oneDNN-packed"}  # any float32 value: oneDNN's path


def test_a_bf16_model_on_the_vdpbf16ps_kernel_agrees_with_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 run forced onto the vdpbf16ps kernel: the weights take it, and a prefill's and a decode step's logits
    stay as close to transformers' as bf16 on oneDNN does (test_half_precision_runs_and_agrees)."""
    from kvbench.cpu import cpu_choices
    from kvbench.kernels import cpu_bf16_dot

    if not cpu_bf16_dot.available():
        pytest.skip(f"the vdpbf16ps kernel is unavailable here: {cpu_bf16_dot.unavailable_reason()}")
    monkeypatch.setattr(cpu_bf16_dot, "MIN_WEIGHT_ELEMENTS", 0)  # the test shape's weights are small
    monkeypatch.setenv(cpu_choices.FORCE_ENV, "bf16-dot")
    model = build_random_model(GQA, seed=7, dtype=torch.bfloat16)
    runner = ModelRunner(model, num_blocks=8, block_size=16)
    weights = [runner.lm_head, *(getattr(runner.layers[0], name) for name in ("qkv_proj", "o_proj", "down_proj"))]
    assert all(isinstance(w.copies["bf16-dot"], cpu_bf16_dot.DotWeight) for w in weights)
    prompt = make_prompts(GQA.vocab_size, (30,))[0]
    logits = runner.forward(runner.build_step([(prompt, 0, [3, 5])]))
    with torch.no_grad():
        expected = model(torch.tensor([prompt])).logits[0, -1].float()
    torch.testing.assert_close(logits[0], expected, rtol=0, atol=0.15)
    step = runner.forward(runner.build_step([([int(logits[0].argmax())], 30, [3, 5])]))  # a decode step
    with torch.no_grad():
        expected = model(torch.tensor([[*prompt, int(logits[0].argmax())]])).logits[0, -1].float()
    torch.testing.assert_close(step[0], expected, rtol=0, atol=0.15)


def test_fuse_rows_with_biases_fills_missing_ones_with_zeros() -> None:
    torch.manual_seed(0)
    modules = [torch.nn.Linear(4, 3, bias=True), torch.nn.Linear(4, 2, bias=False)]
    x = torch.randn(5, 4)
    expected = torch.cat([m(x) for m in modules], dim=1)
    weight = fuse_rows([m.weight for m in modules])
    bias = _fused_bias(modules)
    torch.testing.assert_close(torch.nn.functional.linear(x, weight, bias), expected)  # one matmul vs two: rounding
    assert torch.equal(modules[1].bias, torch.zeros(2))


def test_build_step_tensors() -> None:
    runner = ModelRunner(model_for(GQA), num_blocks=16, block_size=4)
    step = runner.build_step([([5, 6, 7], 2, [9, 3]), ([8], 6, [1, 4])])
    assert step.positions.tolist() == [2, 3, 4, 6]
    assert step.slot_mapping.tolist() == [9 * 4 + 2, 9 * 4 + 3, 3 * 4 + 0, 4 * 4 + 2]
    assert step.query_start_loc.tolist() == [0, 3, 4]
    assert step.context_lens.tolist() == [5, 7]
    assert step.block_tables.dtype == torch.int32 and step.block_tables.tolist() == [[9, 3], [1, 4]]
    assert not step.is_decode and step.max_context_len == 7 and step.max_query_len == 3
    with pytest.raises(ValueError, match="cannot hold"):
        runner.build_step([([1, 2, 3], 6, [0, 1])])


def test_triton_backend_matches_transformers() -> None:
    """The runner on the Triton kernels (CPU tensors run them in Triton's interpreter: TRITON_INTERPRET=1)."""
    pytest.importorskip("triton")
    runner = ModelRunner(model_for(GQA), num_blocks=64, block_size=7, kernel_backend="triton")
    outputs = runner_greedy(runner, make_prompts(GQA.vocab_size), 5, BlockCounter(64, seed=4))
    assert outputs == [tokens[:5] for tokens in hf_greedy(GQA)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_and_agrees(dtype: torch.dtype) -> None:
    model = build_random_model(GQA, seed=7, dtype=dtype)
    runner = ModelRunner(model, num_blocks=8, block_size=16)
    assert runner.k_caches[0].dtype == dtype
    prompt = make_prompts(GQA.vocab_size, (30,))[0]
    logits = runner.forward(runner.build_step([(prompt, 0, [3, 5])]))
    assert logits.dtype == torch.float32
    with torch.no_grad():
        expected = model(torch.tensor([prompt])).logits[0, -1].float()
    torch.testing.assert_close(logits[0], expected, rtol=0, atol=0.15)


def test_matmul_rows_bound_the_row_counts_a_packed_weight_meets() -> None:
    """Every step size from 1 to 1,024 rows meets 72 row counts: exact up to 32, even up to 64 (decode batches, at
    most 1 row of padding), at most 12.5% over above (prefills)."""
    from kvbench.models.runner import DECODE_ROWS, EXACT_ROWS, matmul_rows

    sizes = range(1, 1025)
    padded = [matmul_rows(rows) for rows in sizes]
    assert all(
        rows <= p <= (rows + 1 if rows <= DECODE_ROWS else rows * 1.125) for rows, p in zip(sizes, padded, strict=True)
    )
    assert [matmul_rows(rows) for rows in range(1, EXACT_ROWS + 1)] == list(range(1, EXACT_ROWS + 1))
    assert sorted({matmul_rows(rows) for rows in range(EXACT_ROWS + 1, DECODE_ROWS + 1)}) == list(range(34, 65, 2))
    assert matmul_rows(50) == 50 and matmul_rows(49) == 50  # a decode batch of 50 is not padded to 56
    assert len(set(padded)) == EXACT_ROWS + 16 + 8 * 4  # exact to 32, even to 64, 8 steps an octave to 1024
    assert matmul_rows(65) == 72 and matmul_rows(300) == 320 and matmul_rows(1000) == 1024


def test_a_prefill_multiplies_packed_weights_at_bucketed_row_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill step of an odd token count reaches oneDNN padded to its bucket, and its logits are unchanged."""
    from kvbench.cpu import cpu_linear
    from kvbench.models.runner import matmul_rows

    if not cpu_linear.packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN packing unavailable here")
    model = build_random_model(GQA, seed=7)
    packed = ModelRunner(model, num_blocks=NUM_BLOCKS, block_size=16)
    plain = ModelRunner(model, num_blocks=NUM_BLOCKS, block_size=16, packed_weights=False)
    seen: list[int] = []
    real_linear = cpu_linear.linear

    def spy(x: torch.Tensor, weight, bias=None) -> torch.Tensor:
        if cpu_linear.path_at(weight, x.shape[0]) == cpu_linear.ONEDNN:
            seen.append(x.shape[0])
        return real_linear(x, weight, bias)

    monkeypatch.setattr(cpu_linear, "linear", spy)
    prompts = make_prompts(GQA.vocab_size, (70, 61, 9))  # 140 tokens: padded to 144
    blocks = BlockCounter()
    chunks = [(p, 0, blocks.take(len(p), 16)) for p in prompts]
    logits = packed.forward(packed.build_step(chunks))
    assert set(seen) == {matmul_rows(140), len(prompts)} and matmul_rows(140) == 144  # layers at 144, lm_head at 3
    seen.clear()
    decode = [(p[-1:], len(p) - 1, table) for p, (_, _, table) in zip(prompts, chunks, strict=True)] * 11  # 33 rows
    packed.forward(packed.build_step(decode))
    assert set(seen) == {matmul_rows(33)} == {34}  # a decode batch of 33 multiplies 34 rows
    assert logits.shape == (3, GQA.vocab_size)
    torch.testing.assert_close(logits, plain.forward(plain.build_step(chunks)), rtol=1e-4, atol=1e-4)
