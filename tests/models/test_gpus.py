"""GPU presets and the KV budget: utilization x memory - weights - activation reserve."""

import pytest

from kvbench.errors import KvbenchError
from kvbench.models.gpus import GIB, GPU_PRESETS, activation_reserve_bytes, kv_budget, resolve_gpu
from kvbench.models.resolve import resolve_model


def test_presets_and_their_memory():
    expected = {
        "a10g-24g": 24,
        "l4-24g": 24,
        "a100-40g": 40,
        "a100-80g": 80,
        "h100-80g": 80,
        "h200-141g": 141,
        "h100-sxm-80g": 80,
        "h100-pcie-80g": 80,
        "b200-180g": 180,
        "gb200-186g": 186,
        "l40s-48g": 48,
        "rtx4090-24g": 24,
        "rtx5090-32g": 32,
        "mi300x-192g": 192,
        "mi325x-256g": 256,
        "gaudi3-128g": 128,
    }
    assert {name: spec.memory_bytes // GIB for name, spec in GPU_PRESETS.items()} == expected
    assert all(spec.memory_bytes % GIB == 0 for spec in GPU_PRESETS.values())
    assert all(spec.bandwidth_bytes_per_s > 0 and spec.peak_flops > 0 for spec in GPU_PRESETS.values())
    assert all(name.endswith(f"-{spec.memory_bytes // GIB}g") for name, spec in GPU_PRESETS.items())


def test_gpu_memory_replaces_the_preset_memory():
    gpu = resolve_gpu("h100-80g", 141 * GIB)
    assert gpu.memory_bytes == 141 * GIB and gpu.name == "h100-80g, 141 GiB"
    assert gpu.bandwidth_bytes_per_s == GPU_PRESETS["h100-80g"].bandwidth_bytes_per_s
    with pytest.raises(KvbenchError, match="GPU memory must be a positive number of bytes"):
        resolve_gpu("h100-80g", 0)
    custom = resolve_gpu("custom", 141 * GIB)
    assert custom.memory_bytes == 141 * GIB and custom.name == "GPU of 141 GiB"
    with pytest.raises(KvbenchError, match="a custom GPU needs its memory size"):
        resolve_gpu("custom")


def test_tensor_parallelism_splits_the_activation_reserve():
    shape = resolve_model("llama-2-13b")  # MLP 13,824, hidden 5,120, vocab 32,000, fp16
    per_token = (3 * 13824 // 4 + 4 * 5120) * 2
    assert activation_reserve_bytes(shape, 2048, 4) == 2048 * per_token + 4 * 8000 * 256
    assert activation_reserve_bytes(shape, 2048, 4, logits=False) == 2048 * per_token


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(KvbenchError) as caught:
        resolve_gpu("tpu-v9")
    assert all(name in str(caught.value) for name in GPU_PRESETS)


def test_activation_reserve_by_hand():
    tiny = resolve_model("tiny")  # fp32, hidden 64, intermediate 128, vocab 512
    per_token = (3 * 128 + 4 * 64) * 4
    assert activation_reserve_bytes(tiny, 2048) == 2048 * per_token + 4 * 512 * 256
    assert activation_reserve_bytes(tiny, 100) == 100 * per_token + 4 * 512 * 100


def test_kv_budget_is_what_is_left_after_weights_and_activations():
    shape = resolve_model("llama-2-13b")
    gpu = resolve_gpu("a100-80g")
    budget = kv_budget(shape, gpu, 0.9)
    assert budget.usable_bytes == int(0.9 * 80 * GIB)
    assert budget.kv_bytes == budget.usable_bytes - shape.weight_bytes - activation_reserve_bytes(shape)
    assert budget.fits and budget.kv_bytes > 40 * GIB
    assert kv_budget(shape, gpu, 0.5).kv_bytes < budget.kv_bytes


def test_llama_2_13b_fp16_does_not_fit_an_a10g():
    budget = kv_budget(resolve_model("llama-2-13b"), resolve_gpu("a10g-24g"))
    assert not budget.fits and budget.kv_bytes < 0
    assert kv_budget(resolve_model("llama-2-7b"), resolve_gpu("a10g-24g")).fits


@pytest.mark.parametrize("utilization", [0.0, -0.1, 1.01])
def test_utilization_out_of_range_is_refused(utilization):
    with pytest.raises(KvbenchError, match="GPU memory utilization must be in"):
        kv_budget(resolve_model("tiny"), resolve_gpu("l4-24g"), utilization)


def test_moe_activations_count_the_experts_a_token_runs():
    from kvbench.models.gpus import mlp_width_per_token
    from kvbench.models.shapes import ModelShape, MoeSpec

    dense = resolve_model("tiny")
    assert mlp_width_per_token(dense) == dense.intermediate_size
    every_layer = ModelShape("m", 2, 64, 4, 2, 128, 100, moe=MoeSpec(8, 2, 96, 2, shared_expert_intermediate_size=32))
    assert mlp_width_per_token(every_layer) == 2 * 96 + 32
    some_layers = ModelShape("m", 2, 64, 4, 2, 512, 100, moe=MoeSpec(8, 2, 96, 1))
    assert mlp_width_per_token(some_layers) == 512  # its dense layer is wider than two experts
