"""Remedies are keys rendered per engine family: each family hears about its own knobs only."""

from __future__ import annotations

import re

import pytest

from kvbench.report.diagnose.remedies import REMEDIES, phrase, render

FAMILY_FLAGS = {
    "kvbench": {
        "--kv-memory",
        "--engines",
        "--reserve",
        "--block-size",
        "--gpu-memory-utilization",
        "--resume",
        "--autoscale",
        "--scale-up",
        "--policies",
        "--prefix-caching",  # kvbench serve's
    },
    "vllm": {
        "--gpu-memory-utilization",
        "--kv-cache-memory-bytes",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--block-size",
        "--enable-prefix-caching",
        "--tensor-parallel-size",
    },
    "sglang": {
        "--mem-fraction-static",
        "--context-length",
        "--max-running-requests",
        "--chunked-prefill-size",
        "--page-size",
        "--disable-radix-cache",
        "--tp-size",
        "--max-prefill-tokens",
    },
}


@pytest.mark.parametrize("family", sorted(FAMILY_FLAGS))
def test_every_phrase_names_only_its_own_familys_flags(family):
    context = {
        "block_size": 16,
        "gpu_memory_utilization": "0.9",
        "kv_cache_memory_bytes": "1024",
        "max_len": 2048,
        "reserve": "max",
    }
    for key, by_family in REMEDIES.items():
        if family not in by_family:
            continue
        text = phrase(key, family, context)
        assert text and text == text.strip()
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", text))
        assert flags <= FAMILY_FLAGS[family], (key, flags - FAMILY_FLAGS[family])


def test_render_joins_what_the_family_has_and_quotes_its_settings():
    assert render(("more_kv_memory", "layout"), "vllm", {"gpu_memory_utilization": "0.92"}) == (
        "give the KV cache more memory: raise --gpu-memory-utilization (now 0.92) or set --kv-cache-memory-bytes, "
        "or free memory with a lower --max-model-len"
    )  # vLLM has no contiguous layout to change
    assert "(now" not in render(("smaller_blocks",), "vllm", {})  # unknown settings are not quoted as "?"
    assert (
        render(("smaller_blocks",), "kvbench", {"block_size": 32})
        == "use a smaller --block-size (now 32; 16-32 work best)"
    )
    with pytest.raises(KeyError):
        phrase("bogus", "vllm")
