"""The peak probes on every instruction-set variant this CPU runs: they do the work they count, the rates come out
finite and positive (no figure is asserted: a probe's speed is the machine's), the caches are read from sysfs, and
a CPU with AMX gets no peak rather than a wrong one."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
from isa_variants import runnable_variants

from kvbench.kernels import cpu_native, cpu_peak


@pytest.fixture(params=runnable_variants())
def lib(request, monkeypatch: pytest.MonkeyPatch) -> ctypes.CDLL:
    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.setenv(cpu_native.ISA_ENV, request.param)
    loaded = cpu_native._load()
    if loaded is None:
        pytest.skip(f"no C kernels here: {cpu_native.unavailable_reason()}")
    return loaded


def test_the_float32_probe_counts_its_multiply_adds(lib) -> None:
    sink = ctypes.c_float()
    lanes, chains = lib.kvbench_peak_vector_bits() // 32, {512: 12, 256: 10, 128: 8}[lib.kvbench_peak_vector_bits()]
    assert lib.kvbench_peak_fma(1000, ctypes.byref(sink)) == 1000 * chains * lanes * 2
    # chain c starts at 0.999 (c + 1) and goes 1000 steps of x -> 0.999 x + 0.001 towards its fixed point, 1
    expected = sum(lanes * (1 + (0.999 * (c + 1) - 1) * 0.999**1000) for c in range(chains))
    assert sink.value == pytest.approx(expected, rel=1e-3)


def test_the_bfloat16_probe_runs_where_the_build_has_vdpbf16ps(lib) -> None:
    sink = ctypes.c_float()
    done = lib.kvbench_peak_dpbf16(10, ctypes.byref(sink))
    if "AVX-512 BF16 (vdpbf16ps)" in cpu_native.instruction_sets():
        assert done == 10 * 12 * 16 * 4
        # 12 chains starting at 0..11, each of 16 lanes adding 10 x 2 products of the bfloat16 numbers 0x3f7f, 0x3a83
        a, b = torch.tensor([0x3F7F, 0x3A83], dtype=torch.int16).view(torch.bfloat16).tolist()
        start = 16 * sum(range(12))
        assert sink.value == pytest.approx(start + 12 * 16 * 20 * a * b, rel=1e-4)
    else:
        assert done == -1


def test_the_read_probe_reads_every_whole_group_of_vectors(lib) -> None:
    group = 8 * lib.kvbench_peak_vector_bits() // 32
    data = torch.arange(3 * group + 5, dtype=torch.float32)
    sink = ctypes.c_float()
    assert lib.kvbench_read_sweep(data.data_ptr(), data.numel(), ctypes.byref(sink)) == 3 * group * 4
    assert sink.value == pytest.approx(float(data[: 3 * group].sum()))


def test_measure_gives_finite_positive_rates() -> None:
    if cpu_peak.has_amx():
        with pytest.raises(cpu_peak.PeakUnavailable, match="AMX"):
            cpu_peak.measure()
        return
    if not cpu_native.available():
        pytest.skip(f"no C kernels here: {cpu_native.unavailable_reason()}")
    peaks = cpu_peak.measure()
    for rate in (peaks.fma_flops, peaks.read_bytes, peaks.matmul_flops("fp32"), peaks.matmul_flops("bf16")):
        assert 0 < rate < float("inf")
    assert (peaks.dot_bf16_flops is not None) == ("AVX-512 BF16 (vdpbf16ps)" in cpu_native.instruction_sets())
    assert "GFLOP/s" in peaks.describe("bf16") and "GB/s memory reads" in peaks.describe("fp32")
    with pytest.raises(ValueError, match="fp8"):
        peaks.matmul_flops("fp8")


def test_amx_cpus_get_no_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_native, "_cpu_flags", lambda: {"avx512f", "amx_tile", "amx_bf16"})
    with pytest.raises(cpu_peak.PeakUnavailable, match="AMX"):
        cpu_peak.measure()


def write_cache(root: Path, cpu: int, index: int, level: int, kind: str, size: str, shared: str) -> None:
    folder = root / f"cpu{cpu}" / "cache" / f"index{index}"
    folder.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (folder / name).write_text(f"{value}\n")


def test_caches_are_summed_once_each_and_instruction_caches_left_out(tmp_path: Path) -> None:
    for cpu in (0, 1):
        write_cache(tmp_path, cpu, 0, 1, "Data", "32K", str(cpu))
        write_cache(tmp_path, cpu, 1, 1, "Instruction", "32K", str(cpu))
        write_cache(tmp_path, cpu, 2, 2, "Unified", "1024K", str(cpu))
        write_cache(tmp_path, cpu, 3, 3, "Unified", "32M", "0-1")  # one L3 the two CPUs share
    assert cpu_peak.cache_bytes(tmp_path) == 2 * (32 << 10) + 2 * (1 << 20) + (32 << 20)


def test_unreadable_or_missing_cache_sizes_give_none(tmp_path: Path) -> None:
    assert cpu_peak.cache_bytes(tmp_path) is None
    write_cache(tmp_path, 0, 0, 1, "Data", "lots", "0")
    assert cpu_peak.cache_bytes(tmp_path) is None
