"""Pre-flight checks: counts within limits, memory against an injected amount free, context length; wired into
``load_model`` and ``build_engine`` so that a run that cannot fit is refused before it allocates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench import preflight
from kvbench.errors import KvbenchError
from kvbench.models.resolve import resolve_model
from kvbench.models.shapes import ModelShape
from kvbench.preflight import (
    GIB,
    LIMITS,
    MemoryNeed,
    available_device_bytes,
    available_host_bytes,
    check_context_length,
    check_count,
    check_kv_pool_for_device,
    check_memory,
    check_model_memory_for_device,
    check_request_memory,
    check_requests_for_host,
    check_run_counts,
    check_weights_for_host,
    kv_pool_bytes,
    parse_meminfo,
    request_list_bytes,
)


def one_line(caught: pytest.ExceptionInfo) -> str:
    text = str(caught.value)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------------------------------------- counts


@pytest.mark.parametrize(
    "given, message",
    [
        ({"block_size": 100_000}, "block size 100,000 is above kvbench's limit of 4,096"),
        ({"num_blocks": 99_999_999_999}, "KV pool blocks 99,999,999,999 is above kvbench's limit of 2,147,483,647"),
        ({"requests": 1_000_000_000}, "requests 1,000,000,000 is above kvbench's limit of 10,000,000"),
        ({"prompts": 2_000_000}, "prompts 2,000,000 is above"),
        ({"samples": 5000}, "samples (or beams) per prompt 5,000 is above"),
        ({"prompts": 100_000, "samples": 1000}, "prompts x samples per prompt 100,000,000 is above"),
        ({"block_size": 0}, "block size must be a positive integer, got 0"),
        ({"requests": -3}, "requests must be a positive integer, got -3"),
        ({"num_blocks": True}, "KV pool blocks must be a positive integer, got True"),
    ],
)
def test_counts_out_of_range_are_refused(given: dict, message: str) -> None:
    with pytest.raises(KvbenchError) as caught:
        check_run_counts(**given)
    assert message in one_line(caught)


def test_counts_at_their_limits_pass() -> None:
    check_run_counts(
        requests=LIMITS["requests"],
        prompts=1000,
        samples=LIMITS["samples"],
        block_size=LIMITS["block_size"],
        num_blocks=LIMITS["num_blocks"],
    )
    check_run_counts()
    check_count("max_len", 10, limit=10, option="max-len")


# ---------------------------------------------------------------------------------------------- memory


def test_memory_fits_up_to_the_margin() -> None:
    need = MemoryNeed(weights=6 * GIB, kv_pool=2 * GIB, activations=1 * GIB)
    assert need.total == 9 * GIB
    check_memory(need, available=10 * GIB, device="cuda:0")  # 90% of 10 GiB is 9 GiB: just fits
    with pytest.raises(KvbenchError) as caught:
        check_memory(need, available=10 * GIB - 1, device="cuda:0")
    text = one_line(caught)
    assert "needs 9.00 GiB on cuda:0 (weights 6.00 GiB + KV pool 2.00 GiB + activations 1.00 GiB)" in text
    assert "10.00 GiB free" in text and "90%" in text
    assert "smaller model" in text and "fewer blocks" in text and "less KV memory" in text and "another device" in text


def test_breakdown_names_only_what_is_needed() -> None:
    assert MemoryNeed(kv_pool=GIB).breakdown() == "KV pool 1.00 GiB"
    assert MemoryNeed().breakdown() == "nothing"


def test_kv_pool_bytes() -> None:
    assert kv_pool_bytes(4096, 16, 819_200) == 4096 * 16 * 819_200


def test_llama_2_13b_on_a_small_host_is_refused() -> None:
    shape = resolve_model("llama-2-13b", "fp32")
    with pytest.raises(KvbenchError) as caught:
        check_model_memory_for_device(shape, "cpu", available=16 * GIB)
    text = one_line(caught)
    assert f"weights {shape.weight_bytes / GIB:.2f} GiB" in text and "on this host" in text
    check_model_memory_for_device(shape, "cpu", available=64 * GIB)


def test_a_pool_too_large_for_the_device_is_refused() -> None:
    tiny = resolve_model("tiny")
    check_kv_pool_for_device(tiny, "cpu", num_blocks=4096, block_size=16, available=GIB)
    pool = kv_pool_bytes(4096, 16, tiny.bytes_per_token)
    check_kv_pool_for_device(tiny, "cpu", num_blocks=4096, block_size=16, available=int(2 * pool / 0.9) + 1, pools=2)
    with pytest.raises(KvbenchError, match="KV pool 0.06 GiB") as caught:
        check_kv_pool_for_device(
            tiny, "cpu", num_blocks=4096, block_size=16, available=int(2 * pool / 0.9) - 1, pools=2
        )
    assert "2 pools of 0.03 GiB are alive at once" in one_line(caught)  # why the need is twice the pool asked
    with pytest.raises(KvbenchError) as caught:
        check_kv_pool_for_device(tiny, "cpu", num_blocks=100_000_000, block_size=16, available=GIB)
    assert "KV pool 762.94 GiB" in one_line(caught)
    with pytest.raises(KvbenchError, match="KV pool blocks 99,999,999,999 is above"):
        check_kv_pool_for_device(tiny, "cpu", num_blocks=99_999_999_999, block_size=16, available=GIB)


def test_packed_weights_count_against_the_pool() -> None:
    """The CPU's packed weight copy is made before the pool: a pool that fits alone can fail beside it."""
    tiny = resolve_model("tiny")
    pool = kv_pool_bytes(4096, 16, tiny.bytes_per_token)
    check_kv_pool_for_device(tiny, "cpu", num_blocks=4096, block_size=16, available=int(pool / 0.9) + 1)
    with pytest.raises(KvbenchError, match="weights 0.50 GiB"):
        check_kv_pool_for_device(
            tiny, "cpu", num_blocks=4096, block_size=16, available=int(pool / 0.9) + 1, extra_weights=GIB // 2
        )


def test_request_list_memory() -> None:
    assert request_list_bytes(10, 1000, 500) == 10 * 2048 + 1000 * 40 + 500 * 80
    check_request_memory(10_000, 10_000 * 500, available=GIB)
    with pytest.raises(KvbenchError) as caught:
        check_request_memory(5_000_000, 5_000_000 * 1000, available=8 * GIB)
    text = one_line(caught)
    assert "5,000,000 requests" in text and "host memory" in text and "fewer or shorter requests" in text
    with pytest.raises(KvbenchError, match="requests 1,000,000,000 is above"):
        check_requests_for_host(1_000_000_000, 1_000_000_000, available=GIB)
    check_requests_for_host(100, 100 * 64, available=GIB)


# ---------------------------------------------------------------------------------------------- context length


def test_context_length() -> None:
    llama = resolve_model("llama-2-7b")
    check_context_length(llama, 4096)
    with pytest.raises(KvbenchError) as caught:
        check_context_length(llama, 4097)
    text = one_line(caught)
    assert "max-len 4,097" in text and "4,096 tokens" in text
    stretched = ModelShape(
        "long",
        2,
        64,
        4,
        2,
        128,
        100,
        max_position_embeddings=1024,
        rope_scaling={"rope_type": "dynamic", "factor": 4.0},
    )
    check_context_length(stretched, 4096)
    with pytest.raises(KvbenchError, match="max-len must be a positive integer"):
        check_context_length(llama, 0)


# ---------------------------------------------------------------------------------------------- the machine


def test_parse_meminfo() -> None:
    text = "MemTotal:       16318412 kB\nMemFree:         1027768 kB\nMemAvailable:    9874112 kB\n"
    assert parse_meminfo(text) == 9874112 * 1024
    assert parse_meminfo("MemTotal: 1 kB\nMemFree: 2 kB\n") is None
    assert parse_meminfo("") is None


def test_available_host_bytes_reads_meminfo_or_falls_back(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 2048 kB\nMemAvailable: 1024 kB\n")
    assert available_host_bytes(meminfo) == 1024 * 1024
    assert available_host_bytes(tmp_path / "absent") > 0  # os.sysconf's free pages


def test_available_device_bytes_asks_the_driver_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    asked = []

    def mem_get_info(device):
        asked.append(device)
        return 5 * GIB, 80 * GIB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert available_device_bytes(torch.device("cuda", 1)) == 5 * GIB and asked == [torch.device("cuda", 1)]
    monkeypatch.setattr(preflight, "available_host_bytes", lambda *args: 3 * GIB)
    assert available_device_bytes(torch.device("cpu")) == available_device_bytes("cpu") == 3 * GIB


def test_checkpoint_weights_must_fit_the_host_on_their_way_to_a_gpu() -> None:
    shape = resolve_model("llama-2-7b", "fp16")
    check_weights_for_host(shape, available=32 * GIB)
    with pytest.raises(KvbenchError, match="read into host memory before it moves to the GPU"):
        check_weights_for_host(shape, available=8 * GIB)


# ---------------------------------------------------------------------------------------------- wired into the engine


@pytest.fixture
def small_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host has 4 GiB free, whatever this machine has."""
    monkeypatch.setattr(preflight, "available_host_bytes", lambda *args: 4 * GIB)


def test_load_model_refuses_a_model_larger_than_the_host_before_allocating(small_host, monkeypatch) -> None:
    from kvbench.studies import local_model as build

    def never(*args, **kwargs):
        raise AssertionError("weights were allocated")

    monkeypatch.setattr(build, "build_random_model", never)
    with pytest.raises(KvbenchError) as caught:
        build.load_model("llama-2-13b", device="cpu")
    assert "on this host" in one_line(caught) and "4.00 GiB free" in str(caught.value)


def test_load_model_refuses_a_max_len_past_the_context() -> None:
    from kvbench.studies.local_model import load_model

    with pytest.raises(KvbenchError, match="max-len 8,192 exceeds the context length of tiny .4,096 tokens"):
        load_model("tiny", device="cpu", max_len=8192)
    assert load_model("tiny", device="cpu", max_len=4096).shape.name == "tiny"


def test_load_model_refuses_a_mixture_of_experts_before_its_weights(tmp_path: Path) -> None:
    from kvbench.studies.local_model import load_model

    config = {
        "model_type": "mixtral",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "max_position_embeddings": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(KvbenchError, match="is mixtral: the tensor engine runs dense Llama-family models"):
        load_model(str(tmp_path), device="cpu")


def test_build_engine_refuses_a_pool_larger_than_what_is_free(small_host) -> None:
    from kvbench.engine.llm_engine import EngineConfig
    from kvbench.studies.local_model import build_engine, load_model

    loaded = load_model("tiny", device="cpu")
    with pytest.raises(KvbenchError) as caught:
        build_engine(loaded, EngineConfig(num_blocks=10_000_000, block_size=16))
    assert "KV pool 76.29 GiB" in one_line(caught)
    with pytest.raises(KvbenchError, match="block size 100,000 is above"):
        build_engine(loaded, EngineConfig(num_blocks=4, block_size=100_000))
    assert build_engine(loaded, EngineConfig(num_blocks=64, block_size=16)).runner.num_blocks == 64
