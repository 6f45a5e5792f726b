"""The matmul plan: each weight's path by row count, measured on this CPU, cached, forced for tests, followed by
the runner; and its rules (ties keep the packed copy, row ranges between measured row counts)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvbench.cpu import cpu_choices, cpu_linear
from kvbench.cpu.cpu_choices import MatmulChoice
from kvbench.cpu.cpu_linear import BF16DOT, BF16DOT_STREAM, BF16W, BF16W_STREAM, ONEDNN, PLAIN

ROWS = cpu_choices.ROWS


@pytest.fixture
def measuring(tmp_path, monkeypatch):
    """No forced path, a fresh cache: the plan is measured."""
    monkeypatch.delenv(cpu_choices.FORCE_ENV, raising=False)
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KVBENCH_REMEASURE", raising=False)
    if not cpu_linear.packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN packing unavailable here")


def choice(paths: tuple[str, ...], rows: tuple[int, ...] = ROWS) -> MatmulChoice:
    return MatmulChoice("o_proj", (8, 8), rows, paths)


def test_row_counts_take_the_nearest_measured_on_a_log_scale() -> None:
    c = choice((ONEDNN, ONEDNN, PLAIN, ONEDNN, BF16W))
    # boundaries at the geometric means of 1, 16, 64, 256, 1024: 4, 32, 128, 512
    assert [c.path_at(r) for r in (1, 3, 4, 31, 32, 127, 128, 511, 512, 10**6)] == [
        ONEDNN,
        ONEDNN,
        ONEDNN,
        ONEDNN,
        PLAIN,
        PLAIN,
        ONEDNN,
        ONEDNN,
        BF16W,
        BF16W,
    ]
    assert c.routes() == ((0, 32, ONEDNN), (32, 128, PLAIN), (128, 512, ONEDNN), (512, 1 << 62, BF16W))
    assert c.copies == (ONEDNN, BF16W)
    assert choice((PLAIN, PLAIN, ONEDNN, ONEDNN, ONEDNN)).routes() == ((0, 32, PLAIN), (32, 1 << 62, ONEDNN))
    assert choice((PLAIN,) * 5).routes() == ((0, 1 << 62, PLAIN),) and choice((PLAIN,) * 5).copies == ()


def test_the_decision_keeps_few_copies_and_takes_another_path_only_when_clearly_faster() -> None:
    weight = torch.zeros(8, 8)
    timings = {
        1: {PLAIN: 10.0, ONEDNN: 10.3},  # plain 3% faster: a tie, the main path (oneDNN) kept
        16: {PLAIN: 100.0, ONEDNN: 50.0},
        64: {PLAIN: 300.0, ONEDNN: 100.0},
        256: {PLAIN: 50.0, ONEDNN: 100.0},
    }  # plain twice as fast: taken
    c = cpu_choices._decide("o_proj", weight, timings)  # two wins each: oneDNN, faster overall, is the main path
    assert (c.copies, c.paths) == ((ONEDNN,), (ONEDNN, ONEDNN, ONEDNN, PLAIN))
    everywhere = cpu_choices._decide("o_proj", weight, {r: {PLAIN: 1.0, ONEDNN: 2.0} for r in (1, 16)})
    assert everywhere.copies == () and everywhere.paths == (PLAIN, PLAIN)
    # fp32 on a Zen 5, the cache emptied before each call (as measured): the bfloat16 copy wins at one row, oneDNN
    # from 64; both copies are kept, each where it is the faster
    zen5 = {
        1: {PLAIN: 533.6, ONEDNN: 356.5, BF16W: 187.0},
        16: {PLAIN: 1519.2, ONEDNN: 629.2, BF16W: 720.3},
        64: {PLAIN: 3481.4, ONEDNN: 1288.9, BF16W: 1502.8},
        256: {PLAIN: 10399.5, ONEDNN: 4292.7, BF16W: 4942.2},
        1024: {PLAIN: 39417.2, ONEDNN: 17851.2, BF16W: 20980.3},
    }
    mixed = cpu_choices._decide("gate_up_proj", weight, zen5)
    assert mixed.paths == (BF16W, ONEDNN, ONEDNN, ONEDNN, ONEDNN) and mixed.copies == (BF16W, ONEDNN)
    amx = cpu_choices._decide(
        "o_proj", weight, {1: {PLAIN: 9.0, ONEDNN: 8.0, "AMX": 8.2}, 64: {PLAIN: 90.0, ONEDNN: 80.0, "AMX": 20.0}}
    )
    assert amx.paths == ("AMX", "AMX")  # a tie at one row and a win at 64: one copy, AMX's


def _weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"o_proj": torch.randn(96, 64, generator=generator), "lm_head": torch.randn(200, 64, generator=generator)}


def test_measured_on_the_weights_then_cached(measuring, tmp_path) -> None:
    weights = _weights()
    plan = cpu_choices.measure_plan(weights)
    assert plan.source.startswith("measured now at load ") and plan.threads == torch.get_num_threads()
    o_proj, lm_head = plan.choice("o_proj"), plan.choice("lm_head")
    assert o_proj.rows == ROWS and lm_head.rows == cpu_choices.LM_HEAD_ROWS
    for c in (o_proj, lm_head):
        assert set(c.timings_us) == set(c.rows) and all(set(t) == {PLAIN, ONEDNN} for t in c.timings_us.values())
        assert all(us > 0 for t in c.timings_us.values() for us in t.values())
        for rows, path in zip(c.rows, c.paths, strict=True):  # each choice follows its own timings
            t = c.timings_us[rows]
            assert t[path] <= min(t.values()) * cpu_choices.TIE
    assert len(list((tmp_path / "cache").glob("cpu-matmuls-*.json"))) == 1
    again = cpu_choices.measure_plan(weights)
    assert again.source.startswith("cached, measured ") and again.choices == plan.choices
    assert list(again.choice("o_proj").timings_us) == list(ROWS)  # printed in row order, not as JSON sorts keys
    lines = plan.lines()
    assert lines[0].startswith(f"CPU matmul paths, {plan.threads} thread(s), fp32 (measured now")
    assert lines[1].startswith("  o_proj [96 x 64]: ") and "us plain/oneDNN-packed: 1 row " in lines[1]
    assert plan.as_dict()["weights"]["o_proj"]["timings_us"]["1"][PLAIN] == o_proj.timings_us[1][PLAIN]
    used = {path for choice in plan.choices.values() for path in choice.paths}  # the one line the sweep prints
    summary = plan.summary()
    assert summary.startswith("matmul paths ") and summary.endswith(f"({plan.source})")
    assert all(f"{path} for " in summary for path in used) and f"of {len(plan.choices)} weights" in summary


@pytest.mark.parametrize(
    ("forced", "expected"),
    [
        ("plain", ()),
        ("oneDNN", (ONEDNN,)),
        ("packed", (ONEDNN,)),
        ("bf16-weights", (ONEDNN,)),
        ("bf16-weights-stream", (ONEDNN,)),
        ("bf16-dot", (ONEDNN,)),
    ],
)  # float32 weights holding other values: neither bf16-weights' nor bf16-dot's
def test_a_forced_path_measures_nothing(monkeypatch, forced: str, expected) -> None:
    monkeypatch.setenv(cpu_choices.FORCE_ENV, forced)
    plan = cpu_choices.measure_plan(_weights())
    assert plan.source == f"forced by {cpu_choices.FORCE_ENV}={forced}"
    assert all(c.copies == expected and not c.timings_us for c in plan.choices.values())
    monkeypatch.setenv(cpu_choices.FORCE_ENV, "fastest")
    with pytest.raises(ValueError, match="unknown KVBENCH_MATMUL='fastest'"):
        cpu_choices.measure_plan(_weights())


def test_a_bf16_model_times_the_vdpbf16ps_kernel_and_can_be_forced_onto_it(measuring, monkeypatch) -> None:
    from kvbench.kernels import cpu_bf16_dot

    if not cpu_bf16_dot.available():
        pytest.skip(f"the vdpbf16ps kernel is unavailable here: {cpu_bf16_dot.unavailable_reason()}")
    generator = torch.Generator().manual_seed(5)
    weights = {"o_proj": torch.randn(512, 256, generator=generator).bfloat16()}  # large enough for the kernel
    plan = cpu_choices.measure_plan(weights)
    timings = plan.choice("o_proj").timings_us
    assert all(set(t) == {PLAIN, ONEDNN, BF16DOT, BF16DOT_STREAM} for t in timings.values())
    assert plan.lines()[0].startswith(f"CPU matmul paths, {plan.threads} thread(s), bf16 (measured now")
    assert set(plan.choice("o_proj").copies) <= {ONEDNN, BF16DOT}  # streamed or not, the kernel's copy is one
    for name, path in (("bf16-dot", BF16DOT), ("bf16-dot-stream", BF16DOT_STREAM)):
        monkeypatch.setenv(cpu_choices.FORCE_ENV, name)
        forced = cpu_choices.measure_plan(weights)
        assert forced.choice("o_proj").paths == (path,) and not forced.choice("o_proj").timings_us
        assert forced.choice("o_proj").copies == (BF16DOT,)


def test_a_bf16_valued_fp32_model_times_both_ways_of_reading_the_bf16_copy(measuring, monkeypatch) -> None:
    from kvbench.kernels import cpu_bf16_weights

    if not cpu_bf16_weights.available():
        pytest.skip(f"the bfloat16-weight kernel is unavailable here: {cpu_bf16_weights.unavailable_reason()}")
    generator = torch.Generator().manual_seed(6)
    weights = {"o_proj": torch.randn(512, 256, generator=generator).bfloat16().float()}
    plan = cpu_choices.measure_plan(weights)
    assert all({BF16W, BF16W_STREAM} <= set(t) for t in plan.choice("o_proj").timings_us.values())
    assert BF16W_STREAM not in plan.choice("o_proj").copies  # streamed or not, the kernel's copy is one
    for name, path in (("bf16-weights", BF16W), ("bf16-weights-stream", BF16W_STREAM)):
        monkeypatch.setenv(cpu_choices.FORCE_ENV, name)
        forced = cpu_choices.measure_plan(weights)
        assert forced.choice("o_proj").paths == (path,) and forced.choice("o_proj").copies == (BF16W,)


def test_the_runner_follows_the_plan_row_count_by_row_count(monkeypatch) -> None:
    from kvbench.models.hf_model import build_random_model
    from kvbench.models.runner import LAYER_MATMULS, ModelRunner
    from kvbench.models.shapes import ModelShape

    if not cpu_linear.packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN packing unavailable here")
    shape = ModelShape(
        "plan",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        vocab_size=128,
        max_position_embeddings=64,
        dtype="fp32",
    )
    model = build_random_model(shape, seed=3)
    shapes = {
        "qkv_proj": (128, 64),
        "o_proj": (64, 64),
        "gate_up_proj": (192, 64),
        "down_proj": (64, 96),
        "lm_head": (128, 64),
    }
    plan = cpu_choices.MatmulPlan(
        torch.get_num_threads(),
        torch.float32,
        {
            **{
                role: MatmulChoice(role, shapes[role], ROWS, (ONEDNN, ONEDNN, ONEDNN, PLAIN, PLAIN))
                for role in (*LAYER_MATMULS, "lm_head")
            },
            "o_proj": MatmulChoice("o_proj", shapes["o_proj"], ROWS, (PLAIN,) * 5),
        },
        "given",
    )
    setattr(model, cpu_choices._PLAN_ATTR, plan)
    runner = ModelRunner(model, num_blocks=8, block_size=4)
    assert runner.matmul_plan is plan
    layer = runner.layers[0]
    assert isinstance(layer.o_proj, torch.Tensor)  # plain at every row count: no packed copy at all
    weight = layer.gate_up_proj
    assert isinstance(weight, cpu_linear.RoutedWeight) and set(weight.copies) == {ONEDNN}
    assert weight.routes == ((0, 128, ONEDNN), (128, 1 << 62, PLAIN))
    long, short = torch.randn(200, 64), torch.randn(8, 64)
    assert torch.equal(cpu_linear.linear(long, weight), F.linear(long, weight.plain))  # the plain path: exact
    torch.testing.assert_close(cpu_linear.linear(short, weight), F.linear(short, weight.plain), rtol=1e-4, atol=1e-4)
    assert ModelRunner(model, num_blocks=8, block_size=4).layers[1].gate_up_proj is runner.layers[1].gate_up_proj
    every = cpu_linear.packed_copy_bytes(build_random_model(shape, seed=3))
    assert every == 4 * (2 * (128 * 64 + 64 * 64 + 192 * 64 + 64 * 96) + 128 * 64)  # fp32, every weight copied
    assert cpu_linear.packed_copy_bytes(build_random_model(shape, seed=3), plan.copies(2)) == every - 4 * 2 * 64 * 64
    assert cpu_linear.packed_copy_bytes(model, plan.copies(2)) == 0  # packed already


def test_amx_is_never_given_a_weight_it_cannot_multiply_exactly(monkeypatch) -> None:
    weight = torch.randn(64, 64)  # float32 values off the bfloat16 grid
    from kvbench.kernels.cpu_amx import AmxWeight

    for path in ("AMX", BF16W):
        routed = cpu_linear.pack_for(torch.nn.Module(), weight, ((0, 1 << 62, path),))
        assert set(routed.copies) == {ONEDNN} and not isinstance(routed.copies[ONEDNN], AmxWeight)
