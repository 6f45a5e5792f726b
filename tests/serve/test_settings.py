"""How ``kvbench serve`` sizes its KV pool when not told: on a CPU a share of the memory available (as vLLM's CPU
backend does), said in the start-up line; a size given is taken as is."""

from __future__ import annotations

import pytest

from kvbench.serve.settings import ServeOptions, load_served_engine
from kvbench.studies import kv_budget
from kvbench.studies.backends import tensor


def test_a_cpu_server_takes_a_quarter_of_the_available_memory_at_most_4_gib():
    assert kv_budget.cpu_server_budget(64 << 20)[0] == 16 << 20
    assert kv_budget.cpu_server_budget(100 << 30)[0] == 4 << 30
    source = kv_budget.cpu_server_budget(8 << 30)[1]
    assert "2.00 GiB of this CPU's memory (25% of the 8.00 GiB available, at most 4.00 GiB" in source


@pytest.mark.parametrize("given", [None, 1 << 20])
def test_the_served_pool_is_sized_from_this_cpu_unless_a_size_is_given(given, monkeypatch):
    monkeypatch.setattr(tensor, "available_host_bytes", lambda: 64 << 20)  # as if this machine had 64 MiB free
    options = ServeOptions(
        model="tiny",
        device="cpu",
        threads=1,
        max_len=256,
        kv_memory_bytes=given,
        kv_memory_text=None if given is None else "1MiB",
    )
    served = load_served_engine(options)
    slots = served.config.num_blocks * served.config.block_size
    bytes_per_token = 512  # the tiny preset, float32
    if given is None:
        assert slots * bytes_per_token == 16 << 20  # a quarter of the 64 MiB
        assert "of this CPU's memory (25% of the 0.06 GiB available" in served.budget_source
    else:
        assert slots * bytes_per_token == 1 << 20 and served.budget_source == "KV memory 1MiB"
