"""Opt-in: points against a real vLLM OpenAI server on 127.0.0.1, the client's figures checked against the
server's own counters.

Runs only when both are set (and skips, never fails, when either is missing or unusable):

    KVBENCH_VLLM_PYTHON=/path/to/venv/bin/python   # a Python that can import vllm
    KVBENCH_VLLM_MODEL=/path/to/checkpoint          # a local Hugging Face checkpoint directory

The server is started with ``VLLM_SERVER_DEV_MODE=1`` (for ``/reset_prefix_cache``) and stopped at the end.
"""

from __future__ import annotations

import pytest
from vllm_server import MODEL, requires_vllm, vllm_server

from kvbench.endpoint.client import Target
from kvbench.endpoint.load import ClosedLoop, OpenLoop
from kvbench.endpoint.run_point import PointSettings, run_point_sync
from kvbench.endpoint.workloads import multi_turn, shared_prefix

pytestmark = requires_vllm


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    with vllm_server(tmp_path_factory.mktemp("vllm"), {"VLLM_SERVER_DEV_MODE": "1"}) as run:
        yield run.base


def test_a_closed_loop_point_agrees_with_the_servers_own_counters(vllm_url):
    # 2 groups of 4 prompts sharing 256 tokens (2 of vLLM's 128-token CPU blocks); one at a time, so each group's
    # first request fills the cache and the 3 others find both blocks in it
    workload = shared_prefix(
        groups=2, per_group=4, prefix_len=256, suffix_len=16, output_len=12, vocab_size=5000, seed=0, first_id=100
    )
    warmup = shared_prefix(
        groups=1, per_group=1, prefix_len=16, suffix_len=4, output_len=4, vocab_size=5000, seed=9, first_id=100
    )
    point = run_point_sync(
        Target(vllm_url, model=MODEL),
        workload,
        PointSettings(ClosedLoop(1), warmup=warmup, reset_prefix_cache=True, scrape_interval_s=0.2),
    )
    m, s = point.metrics, point.server
    assert point.status == "ok" and m.completed == 8 and m.total_output_tokens == 8 * 12
    assert m.total_input_tokens == 8 * 272 and m.output_tokens_from == {"usage": 8}
    assert point.cache_reset["reset"] is True
    assert s.families == ["vllm"] and s.server_generation_tokens == 96 and s.server_prompt_tokens == 8 * 272
    assert s.prefix_cache_queries == 8 * 272 and s.prefix_cache_hits == 2 * 3 * 256
    assert s.server_ttft_count == 8 and 0 <= point.agreement.mean_ttft_client_minus_server_ms < 100
    assert s.running_peak == 1 and s.kv_usage_peak > 0


def test_an_open_loop_of_chat_conversations(vllm_url):
    conversations = multi_turn(conversations=3, turns=2, user_len=12, output_len=8, seed=0)
    point = run_point_sync(
        Target(vllm_url, api="chat", model=MODEL),
        conversations,
        PointSettings(OpenLoop(rate=4.0, max_concurrency=2, seed=1)),
    )
    assert point.metrics.completed == 6 and point.metrics.total_output_tokens == 48
    second = [r for r in point.records if r.turn == 1]
    first = {r.conversation: r for r in point.records if r.turn == 0}
    # the second turn resent the first turn and its answer: the server counted more prompt tokens
    assert all(r.prompt_tokens > first[r.conversation].prompt_tokens + 8 for r in second)
