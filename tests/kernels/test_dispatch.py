"""The dispatch layer: device decides, ``backend=`` and ``KVBENCH_KERNEL_BACKEND`` override."""

from __future__ import annotations

import pytest
import torch
from kv_cases import make_case, poisoned_like

from kvbench import kernels
from kvbench.errors import KvbenchError
from kvbench.kernels import cpu_native, reference


def test_device_decides_and_overrides_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVBENCH_KERNEL_BACKEND", raising=False)
    assert kernels.resolve_backend(torch.device("cpu")) == ("native" if cpu_native.available() else "torch")
    assert kernels.resolve_backend(torch.device("cuda")) == "triton"
    assert kernels.resolve_backend(torch.device("cuda"), "torch") == "torch"
    monkeypatch.setenv("KVBENCH_KERNEL_BACKEND", "triton")
    assert kernels.resolve_backend(torch.device("cpu")) == "triton"
    assert kernels.resolve_backend(torch.device("cpu"), "torch") == "torch"


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(KvbenchError, match="unknown kernel backend"):
        kernels.resolve_backend(torch.device("cpu"), "cuda-graphs")


def test_torch_backend_writes_into_out() -> None:
    case = make_case([9, 30], 8, 1, 16, seed=1)
    query = torch.randn(2, 2, 16)
    out = poisoned_like(query)
    result = kernels.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, 0.25, "torch", out=out, num_splits=4
    )
    assert result is out and not torch.isnan(out).any()


def test_both_backends_agree_through_dispatch(device: torch.device) -> None:
    pytest.importorskip("triton")
    case = make_case([9, 30], 8, 1, 16, seed=2, device=device)
    query = torch.randn(2, 2, 16).to(device)
    args = (query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, 0.25)
    by_torch = kernels.paged_decode_attention(*args, backend="torch")
    by_triton = kernels.paged_decode_attention(*args, backend="triton", max_context_len=30)
    torch.testing.assert_close(by_triton, by_torch, rtol=1e-5, atol=1e-6)
    assert torch.equal(by_torch, reference.paged_decode_attention(*args))


def test_planners_plan_for_the_torch_path_only() -> None:
    case = make_case([9, 30], 8, 1, 16, seed=3)
    starts = torch.tensor([0, 9, 39], dtype=torch.int32)
    assert isinstance(
        kernels.plan_decode(case.block_tables, case.context_lens, case.k_cache, "torch"), reference.DecodePlan
    )
    assert isinstance(
        kernels.plan_prefill(case.block_tables, starts, case.context_lens, case.k_cache, 2, "torch"),
        reference.PrefillPlan,
    )
    assert kernels.plan_decode(case.block_tables, case.context_lens, case.k_cache, "triton") is None
    assert kernels.plan_prefill(case.block_tables, starts, case.context_lens, case.k_cache, 2, "triton") is None
