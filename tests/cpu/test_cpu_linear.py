"""How a weight's routes become packed copies: each kernel's two ways of reading its weight (streamed or not) share
one copy, counted once, and a weight the kernel cannot take goes to oneDNN whichever way it was routed."""

from __future__ import annotations

import pytest
import torch

from kvbench.cpu import cpu_linear
from kvbench.kernels import cpu_bf16_dot, cpu_bf16_weights

KERNELS = {  # the kernel's module, its two paths, the dtype its weights and activations have
    "bf16-weights": (cpu_bf16_weights, cpu_linear.BF16W, cpu_linear.BF16W_STREAM, torch.float32),
    "bf16-dot": (cpu_bf16_dot, cpu_linear.BF16DOT, cpu_linear.BF16DOT_STREAM, torch.bfloat16),
}


@pytest.mark.parametrize("kernel", KERNELS)
def test_both_ways_of_reading_share_one_copy(kernel: str) -> None:
    module, unstreamed, streamed_path, dtype = KERNELS[kernel]
    if not module.available():
        pytest.skip(f"the {kernel} kernel is unavailable here: {module.unavailable_reason()}")
    generator = torch.Generator().manual_seed(8)
    weight = (torch.randn(512, 256, generator=generator) / 16).bfloat16().to(dtype)  # bfloat16 values
    assert {unstreamed, streamed_path} <= set(cpu_linear.candidate_paths(weight))
    routes = ((0, 8, streamed_path), (8, 1 << 62, unstreamed))
    routed = cpu_linear.pack_for(torch.nn.Module(), weight, routes)
    plain, streamed = routed.copies[unstreamed], routed.copies[streamed_path]
    assert streamed.stream and not plain.stream and streamed.packed is plain.packed
    assert cpu_linear.path_at(routed, 4) == streamed_path and cpu_linear.path_at(routed, 16) == unstreamed
    assert cpu_linear.path_at(streamed, 1) == streamed_path and cpu_linear.path_at(plain, 1) == unstreamed
    assert cpu_linear.copy_kind(streamed_path) == unstreamed
    x = torch.randn(4, 256, generator=generator).to(dtype)
    assert torch.equal(cpu_linear.linear(x, routed), module.linear(x, plain))  # 4 rows: streamed, the same bits
    model = torch.nn.Linear(256, 512, dtype=dtype)
    counted = [((512, 256), unstreamed, 2), ((512, 256), streamed_path, 1)]
    assert cpu_linear.packed_copy_bytes(model, counted) == 3 * 512 * 256 * 2


def test_a_weight_off_the_bfloat16_grid_goes_to_onednn_whichever_way_it_was_routed() -> None:
    weight = torch.randn(512, 256) + 1e-6  # float32 values off the bfloat16 grid
    if not cpu_linear.packing_available(weight.device, weight.dtype):
        pytest.skip("oneDNN packing is unavailable here")
    for path in (cpu_linear.BF16W, cpu_linear.BF16W_STREAM, cpu_linear.BF16DOT_STREAM):
        routed = cpu_linear.pack_for(torch.nn.Module(), weight, ((0, 1 << 62, path),))
        assert set(routed.copies) == {cpu_linear.ONEDNN}
