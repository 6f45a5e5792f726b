"""The persistent decode batch against a fresh packing of every step (``ModelRunner.build_step``).

Each decode step the engine runs, the arrays the batch advanced in place must equal the arrays packed from
scratch from the scheduler's state: through growth into new blocks, preemption and recompute, copy-on-write
after forks, queued arrivals that change the running set, and contiguous reservations.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.engine.config import EngineConfig
from kvbench.engine.decode_batch import DecodeBatch
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.models.hf_model import build_random_model
from kvbench.models.shapes import ModelShape

SHAPE = ModelShape(
    "test-decode-batch",
    num_layers=1,
    hidden_size=32,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    vocab_size=64,
    dtype="fp32",
)
STEP_FIELDS = ("input_ids", "positions", "slot_mapping", "block_tables", "query_start_loc", "context_lens")


@pytest.fixture(scope="module")
def model():
    return build_random_model(SHAPE, seed=3)


def _checked_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make every DecodeBatch.step also pack the step from scratch and compare; returns the batch sizes seen."""
    original = DecodeBatch.step
    sizes: list[int] = []

    def step(self, batch, clock, table_of, generators):
        got = original(self, batch, clock, table_of, generators)
        expected = self.runner.build_step(
            [([r.output_token_ids[-1]], r.kv_len(clock), table_of(r.request_id)) for r in batch]
        )
        for name in STEP_FIELDS:
            if name != "block_tables":
                assert torch.equal(getattr(got, name), getattr(expected, name)), (name, clock)
        width = got.block_tables.shape[1]  # as wide as the longest context needs, not as all blocks held
        assert width == -(-expected.max_context_len // self.block_size)
        assert torch.equal(got.block_tables, expected.block_tables[:, :width]), clock
        assert got.max_context_len == expected.max_context_len
        assert self.params == [r.sampling for r in batch]
        assert self.generators == [generators[r.request_id] for r in batch]
        sizes.append(len(batch))
        return got

    monkeypatch.setattr(DecodeBatch, "step", step)
    return sizes


def _requests(count: int, params: SamplingParams, num_samples: int = 1) -> list:
    generator = torch.Generator().manual_seed(count)
    return [
        make_request(
            i, torch.randint(0, SHAPE.vocab_size, (3 + 5 * i % 23,), generator=generator).tolist(), params, num_samples
        )
        for i in range(count)
    ]


@pytest.mark.parametrize(
    ("engine", "block_size", "num_blocks", "concurrency"),
    [
        ("paged", 1, 400, 6),  # a new block every step
        ("paged", 7, 60, 6),
        ("paged", 4, 14, 6),  # tight: preemption and recompute
        ("paged", 16, 40, 3),  # queued arrivals change the running set as requests finish
        ("contiguous", 4, 120, 6),
        ("contiguous", 8, 20, 6),  # the baseline queues for room
    ],
)
def test_advanced_batch_equals_fresh_packing(
    model, monkeypatch: pytest.MonkeyPatch, engine: str, block_size: int, num_blocks: int, concurrency: int
) -> None:
    sizes = _checked_steps(monkeypatch)
    config = EngineConfig(engine=engine, block_size=block_size, num_blocks=num_blocks, max_len=64)
    result = LLMEngine(model, config).run(_requests(8, SamplingParams(max_tokens=14, ignore_eos=True)), concurrency)
    assert len(sizes) > 14 and all(len(r.output_token_ids) == 14 for r in result.requests)
    if num_blocks == 14:
        assert result.num_preemptions > 0


def test_forks_and_sampling_keep_the_batch_in_step(model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parallel samples share prompt blocks; their first writes copy them (copy-on-write rows change)."""
    sizes = _checked_steps(monkeypatch)
    params = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=5, ignore_eos=True)
    config = EngineConfig(engine="paged", block_size=4, num_blocks=200, max_len=64)
    result = LLMEngine(model, config).run(_requests(3, params, num_samples=3), 3)
    assert max(sizes) == 9 and len(result.requests) == 9


def test_the_kept_attention_plan_equals_a_fresh_one(model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bias and gather index advanced in place select exactly the keys a plan from scratch selects."""
    from kvbench.kernels import reference

    original = DecodeBatch.step
    checked: list[int] = []
    bucketed: list[int] = []

    def step(self, batch, clock, table_of, generators):
        got = original(self, batch, clock, table_of, generators)
        fresh = reference.plan_decode(
            got.block_tables, got.context_lens, self.block_size, SHAPE.head_dim, valid_tables=True
        )
        kept = got.attention_plan
        lens = got.context_lens.tolist()
        if kept is None:  # lengths differ much: each step is planned in length buckets instead
            assert not reference.decode_padding_is_small(lens, self.block_size) or len(fresh.chunks) > 1
            bucketed.append(clock)
            return got
        assert len(kept.chunks) == len(fresh.chunks) == 1
        assert torch.equal(kept.chunks[0].block_index.long(), fresh.chunks[0].block_index.long())
        assert torch.equal(kept.chunks[0].bias, fresh.chunks[0].bias)
        checked.append(clock)
        return got

    monkeypatch.setattr(DecodeBatch, "step", step)
    for engine, block_size, num_blocks in (("paged", 4, 14), ("paged", 1, 400), ("contiguous", 8, 30)):
        config = EngineConfig(
            engine=engine, block_size=block_size, num_blocks=num_blocks, max_len=64, kernel_backend="torch"
        )  # the plan is the torch reference's
        LLMEngine(model, config).run(_requests(8, SamplingParams(max_tokens=14, ignore_eos=True)), 6)
    generator = torch.Generator().manual_seed(7)  # very different lengths: planned in buckets, step by step
    mixed = [
        make_request(
            i,
            torch.randint(0, SHAPE.vocab_size, (n,), generator=generator).tolist(),
            SamplingParams(max_tokens=6, ignore_eos=True),
        )
        for i, n in enumerate((4, 300, 6, 280, 5))
    ]
    LLMEngine(
        model, EngineConfig(engine="paged", block_size=4, num_blocks=200, max_len=512, kernel_backend="torch")
    ).run(mixed, 5)
    assert len(checked) > 10 and len(bucketed) >= 5  # both kinds of step were exercised


@pytest.mark.parametrize("other", ["triton", "native"])
def test_plan_free_kernels_read_the_kept_batch(model, other: str) -> None:
    """With the Triton kernels (interpreted on CPU) or the CPU's C kernel the batch hands out no torch plan;
    tokens are unchanged."""
    if other == "triton":
        pytest.importorskip("triton")
    else:
        from kvbench.kernels import cpu_native

        if not cpu_native.available():
            pytest.skip(f"CPU kernels unavailable: {cpu_native.unavailable_reason()}")
    params = SamplingParams(max_tokens=5, ignore_eos=True)  # crosses a block: a table patched mid-batch
    outputs = {}
    for backend in ("torch", other):
        config = EngineConfig(engine="paged", block_size=4, num_blocks=40, max_len=40, kernel_backend=backend)
        engine = LLMEngine(model, config)
        result = engine.run(_requests(2, params), 2)
        outputs[backend] = [r.output_token_ids for r in result.requests]
    assert outputs[other] == outputs["torch"]


@pytest.mark.parametrize(("num_blocks", "prompt_len", "added_at"), [(8, 4, 9), (8, 8, 6), (8, 8, 7), (7, 8, 23)])
def test_a_newcomer_that_preempts_itself_leaves_the_kept_batch_as_it_was(
    model, monkeypatch: pytest.MonkeyPatch, num_blocks: int, prompt_len: int, added_at: int
) -> None:
    """A request admitted as the pool runs dry, its prompt filling its last block, needs a new block at its first
    decode step; an older request takes the last one, and the newcomer, the newest, is preempted: the batch is
    the one before it came, and the table it was given room in (freed with it) must not be read."""
    sizes = _checked_steps(monkeypatch)
    config = EngineConfig(engine="paged", block_size=4, num_blocks=num_blocks, max_len=64)
    session = LLMEngine(model, config).session()
    session.add(make_request(0, [1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True)))
    session.add(make_request(2, [9, 8, 7, 6, 5], SamplingParams(max_tokens=20, ignore_eos=True)))
    newcomer = make_request(1, list(range(4, 4 + prompt_len)), SamplingParams(max_tokens=6, ignore_eos=True))
    steps = 0
    while session.has_work or steps <= added_at:
        if steps == added_at:
            session.add(newcomer)
        if session.has_work:
            session.step()
        steps += 1
    assert len(newcomer.output_token_ids) == 6 and newcomer.num_preemptions > 0 and sizes
