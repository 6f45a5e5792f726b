"""``kvbench serve``'s prefix cache seen from outside: each answer's cached prompt tokens, the counters, and the
KV event stream (ZMQ, vLLM's wire format) with its replay socket, checked against each other and by hand.

The same checks run against vLLM in ``tests/endpoint/test_kv_events_vllm_live.py`` (opt-in)."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import replace

import pytest

from kvbench.endpoint.kv_event_subscriber import KvEventSubscriber
from kvbench.measure.kv_events import changes
from kvbench.measure.kv_residency import rebuild
from kvbench.results.servers import read_states
from kvbench.serve.lifecycle import Server, ServerThread

from .conftest import assert_idle_and_drained, engine_of, tiny_options

BLOCK = 16
PREFIX = 50  # tokens shared by a group: floor(50 / 16) * 16 = 48 of them can be served from the cache


def _post(server: ServerThread, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        server.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _counters(server: ServerThread) -> tuple[float, float, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        (state,) = read_states(response.read().decode())
    return state.prefix_queries or 0.0, state.prefix_hits or 0.0, state.cached_blocks or 0.0


def _group_prompt(group: int, index: int) -> list[int]:
    prefix = [(group * 97 + i * 13) % 400 + 5 for i in range(PREFIX)]
    return prefix + [(group * 31 + index * 7 + i) % 400 + 5 for i in range(9)]


@pytest.fixture(scope="module")
def events_server(tiny_model, tmp_path_factory):
    """A paged server of 48 blocks publishing its KV events and answering replays on ipc sockets."""
    folder = tmp_path_factory.mktemp("kv-events")
    options = replace(
        tiny_options(tiny_model, num_blocks=48, block_size=BLOCK),
        kv_events=f"ipc://{folder}/events",
        kv_events_replay=f"ipc://{folder}/replay",
    )
    server = ServerThread(Server(options, "127.0.0.1", 0)).start()
    try:
        yield server
    finally:
        server.stop(grace_s=5.0)


def _listen(server: ServerThread, cls=KvEventSubscriber) -> KvEventSubscriber:
    options = server.server.options
    return cls(options.kv_events, options.kv_events_replay).start()


def test_requests_after_the_first_of_a_group_report_its_full_blocks_and_the_counters_agree(events_server):
    assert _post(events_server, "/reset_prefix_cache", {}) == {"success": True}
    queries_before, hits_before, _ = _counters(events_server)
    listener = _listen(events_server)
    cached, prompts = [], 0
    for group in range(3):
        for index in range(4):
            prompt = _group_prompt(group, index)
            answer = _post(events_server, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "ignore_eos": True})
            cached.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
            prompts += len(prompt)
    assert_idle_and_drained(events_server)
    log = listener.stop()
    # by hand: a group's first request finds nothing, every later one its prefix's 3 full blocks
    assert cached == [0, 48, 48, 48] * 3
    queries, hits, gauge = _counters(events_server)
    assert hits - hits_before == sum(cached) and queries - queries_before == prompts
    resident = rebuild(changes(log), 10.0, log.history_complete)
    assert log.lost_batches == 0 and log.malformed == 0
    # each first request stores its 3 prefix blocks and its own 4th (59 + 3 tokens fill 3 blocks, not 4);
    # every request stores nothing else, so 3 per group
    assert resident.resident_end == engine_of(events_server).stats.cached_blocks == gauge == 9


def test_evictions_are_published_and_the_rebuilt_blocks_equal_the_servers_at_every_idle_moment(events_server):
    listener = _listen(events_server)
    for round_ in range(4):
        for index in range(6):  # 6 distinct prompts of 5 blocks each: more than the 48-block pool keeps
            prompt = [(round_ * 1000 + index * 100 + i) % 500 + 3 for i in range(80)]
            _post(events_server, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "ignore_eos": True})
        assert_idle_and_drained(events_server)
        time.sleep(0.3)  # the last batch on its way
        _, _, gauge = _counters(events_server)
        snapshot = listener.log.batches[:]
        events = rebuild(
            [c for c in changes(replace(listener.log, batches=snapshot))], 10.0, listener.log.history_complete
        )
        assert events.resident_end == gauge
    log = listener.stop()
    assert log.history_complete  # replayed from the server's first batch on
    final = rebuild(changes(log), 10.0, True)
    assert final.removed > 0 and final.removed_unknown == 0
    assert all(lifetime >= 0 for lifetime in final.lifetimes_s)


class _DropsOne(KvEventSubscriber):
    """Loses the second live batch it receives, as a slow reader behind a full queue would."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._seen = 0

    def _take(self, frames, context) -> None:
        self._seen += 1
        if self._seen == 2:
            return
        super()._take(frames, context)


def test_a_lost_batch_is_recovered_from_the_replay_socket(events_server):
    plain, lossy = _listen(events_server), _listen(events_server, _DropsOne)
    for index in range(5):
        prompt = [(index * 50 + i) % 300 + 7 for i in range(40)]
        _post(events_server, "/v1/completions", {"prompt": prompt, "max_tokens": 3, "ignore_eos": True})
    assert_idle_and_drained(events_server)
    expected, got = plain.stop(), lossy.stop()
    assert got.replayed_batches >= 1 and got.lost_batches == 0
    assert [b.seq for b in got.batches] == [b.seq for b in expected.batches]
    assert [(c.kind, c.hashes) for c in changes(got)] == [(c.kind, c.hashes) for c in changes(expected)]


def test_a_reset_is_published_as_everything_cleared(events_server):
    listener = _listen(events_server)
    _post(events_server, "/v1/completions", {"prompt": list(range(3, 40)), "max_tokens": 2, "ignore_eos": True})
    assert_idle_and_drained(events_server)
    assert _post(events_server, "/reset_prefix_cache", {}) == {"success": True}
    time.sleep(0.3)
    log = listener.stop()
    assert [c.kind for c in changes(log)][-1] == "C"
    assert rebuild(changes(log), 10.0, True).resident_end == 0 == engine_of(events_server).stats.cached_blocks


def test_without_prefix_caching_nothing_is_cached_and_the_reset_is_refused(tiny_model):
    options = replace(tiny_options(tiny_model), prefix_caching=False)
    server = ServerThread(Server(options, "127.0.0.1", 0)).start()
    try:
        prompt = list(range(5, 60))
        for _ in range(2):
            answer = _post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "ignore_eos": True})
            assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert _post(server, "/reset_prefix_cache", {}) == {"success": False}
        assert _counters(server) == (0.0, 0.0, 0.0)
    finally:
        server.stop(grace_s=5.0)
