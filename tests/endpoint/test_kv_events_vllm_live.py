"""Opt-in: the prefix cache of a real vLLM server seen as ``kvbench sweep --target`` sees it: each answer's cached
prompt tokens, the server's counters and its KV event stream (ZMQ, listened to on 127.0.0.1, gaps filled from
its replay socket), checked against each other and against hand arithmetic. The same checks run against
``kvbench serve`` in the default suite (``tests/serve/test_kv_events.py``, ``tests/commands/test_sweep_target.py``).

Runs only when ``KVBENCH_VLLM_PYTHON`` and ``KVBENCH_VLLM_MODEL`` are set (see ``tests/vllm_server.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_process import write_shared_prefix_requests
from vllm_server import _free_port, requires_vllm, vllm_server

from kvbench.cli import main
from kvbench.endpoint.kv_event_subscriber import KvEventSubscriber
from kvbench.measure.kv_events import changes
from kvbench.measure.kv_residency import read_kv_events_text, rebuild

pytestmark = requires_vllm
PREFIX = 300  # tokens a group shares
GROUPS, PER_GROUP = 3, 4


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    events, replay = f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events, "replay_endpoint": replay}
    args = ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--skip-tokenizer-init")
    args += ("--kv-events-config", json.dumps(config))
    with vllm_server(tmp_path_factory.mktemp("vllm"), {"VLLM_SERVER_DEV_MODE": "1"}, args) as run:
        yield run.base, events, replay


def _requests(path: Path) -> Path:
    return write_shared_prefix_requests(path, GROUPS, PER_GROUP, PREFIX, 20, 4, vocab=500)


def test_cached_tokens_counters_and_kv_events_agree(vllm, tmp_path, capsys):
    base, events, replay = vllm
    run = tmp_path / "run"
    args = ["sweep", "--target", f"vllm={base}", "--requests-file", str(_requests(tmp_path / "r.jsonl"))]
    args += ["--concurrency", "1", "--reset-prefix-cache", "--kv-events", events, "--kv-events-bind"]
    args += ["--kv-events-replay", replay, "--scrape-interval", "0.1", "--out", str(run)]
    assert main(args) == 0
    capsys.readouterr()
    (point,) = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    reuse, kv = point["prefix_reuse"], point["kv_events"]
    block = reuse["workload"]["block_size"]
    full = PREFIX // block * block
    records = [json.loads(line) for line in (run / point["requests_file"]).read_text().splitlines()]
    assert [r["cached_tokens"] for r in records] == ([0] + [full] * (PER_GROUP - 1)) * GROUPS
    assert reuse["counter_hits"] == reuse["cached_tokens"] == GROUPS * (PER_GROUP - 1) * full
    assert reuse["flag"] is None and point["cache_reset"]["reset"] is True
    assert kv["history_complete"] and kv["lost_batches"] == 0 and kv["malformed"] == 0 and kv["flag"] is None
    # what vLLM stored, by hand: each group's full prefix blocks once, then each request's own full blocks
    own = sum((PREFIX + 20 + 4 - 1) // block - PREFIX // block for _ in range(GROUPS * PER_GROUP))
    assert kv["kv_blocks_stored"] == GROUPS * (PREFIX // block) + own and kv["kv_blocks_removed"] == 0
    figures, rows = read_kv_events_text((run / point["kv_events_file"]).read_text())
    assert rebuild(rows, 10.0, True).resident_end == kv["kv_resident_blocks_end"]


def test_a_lost_batch_is_replayed_by_vllm(vllm, tmp_path, capsys):
    base, events, replay = vllm

    class DropsOne(KvEventSubscriber):
        seen = 0

        def _take(self, frames, context):
            self.seen += 1
            if self.seen != 2:
                super()._take(frames, context)

    listener = DropsOne(events, replay, bind=True).start()
    args = ["sweep", "--target", f"vllm={base}", "--requests-file", str(_requests(tmp_path / "r.jsonl"))]
    assert main([*args, "--concurrency", "2", "--reset-prefix-cache", "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    log = listener.stop()
    assert log.replayed_batches >= 1 and log.lost_batches == 0
    seqs = [b.seq for b in log.batches]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[-1] - seqs[0] + 1 == len(seqs)
    assert rebuild(changes(log), 10.0, log.history_complete).resident_end > 0
