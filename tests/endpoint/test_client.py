"""One request at a time against the fake server: timing, token counts, the body sent, and every way a request
fails ending as a record with its reason, within its limits."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from fake_server import serve_in_thread

from kvbench.endpoint.client import EndpointClient, RequestLimits, Target, list_models, open_session
from kvbench.endpoint.conversation import Conversation, Turn
from kvbench.errors import KvbenchError

FAST = RequestLimits(timeout_s=5.0, stall_s=0.5, connect_s=2.0)


def send(
    url: str,
    conversation: Conversation,
    turn: int = 0,
    answers=(),
    api: str = "completions",
    limits: RequestLimits = FAST,
    api_key: str | None = None,
):
    async def main():
        async with open_session(limits) as session:
            client = EndpointClient(Target(url, api=api), "fake-model", session, limits, api_key)
            return await client.send(conversation, turn, list(answers))

    return asyncio.run(main())


def ids_request(tokens: int = 5, ignore_eos: bool = True) -> Conversation:
    return Conversation(7, (Turn((11, 12, 13, 14), tokens, ignore_eos=ignore_eos),))


def test_a_streamed_completion_is_timed_token_by_token():
    with serve_in_thread(ttft_s=0.05, itl_s=0.02) as server:
        record = send(server.url, ids_request(5))
        body = server.state.bodies[0]
    assert record.ok and record.error_kind is None and record.finish_reason == "length"
    assert body["prompt"] == [11, 12, 13, 14] and body["max_tokens"] == 5 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (record.output_tokens, record.output_tokens_from) == (5, "usage")
    assert (record.prompt_tokens, record.prompt_tokens_from) == (4, "usage")
    assert record.text == " w0_0 w0_1 w0_2 w0_3 w0_4" and len(record.token_times) == 5
    # lower bounds only: the server waits 50 ms, then 20 ms between tokens; a busy machine only adds (but a client
    # kept off the CPU may read several events in one go, so no single gap has a lower bound: the last token does)
    assert record.ttft >= 0.045 and record.latency == record.token_times[-1]
    assert len(record.itl) == 4 and record.latency >= 0.05 + 4 * 0.02 - 0.005
    assert record.tpot == pytest.approx((record.latency - record.ttft) / 4)
    assert record.end >= record.start + record.latency


def test_chat_ttft_waits_for_the_first_token_not_the_role():
    conversation = Conversation(0, (Turn("hello there", 3),))
    with serve_in_thread(ttft_s=0.05) as server:
        record = send(server.url, conversation, api="chat")
        body = server.state.bodies[0]
    assert body["messages"] == [{"role": "user", "content": "hello there"}] and "ignore_eos" not in body
    assert record.ok and len(record.token_times) == 3 and record.text == " w0_0 w0_1 w0_2"
    assert record.ttft >= 0.045  # the role event came at once; the first token after the server's 50 ms


def test_the_api_key_is_sent_from_the_environment_and_never_shown(monkeypatch):
    with serve_in_thread(api_key="sk-secret") as server:
        denied = send(server.url, ids_request())
        record = send(server.url, ids_request(), api_key="sk-secret")
    assert (denied.error_kind, denied.status) == ("http", 401) and record.ok
    target = Target("http://127.0.0.1:1", api_key_env="MY_KEY")
    assert "sk-secret" not in repr(target) and "sk-secret" not in str(target.describe())


def test_without_usage_the_counts_are_left_for_later():
    with serve_in_thread(usage=False) as server:
        record = send(server.url, Conversation(0, (Turn("a b c", 3),)))
    assert record.ok and record.output_tokens is None and record.prompt_tokens is None
    assert record.prompt_input == "a b c"  # kept for a tokenizer count


@pytest.mark.parametrize(
    ("fault", "kind", "status", "message"),
    [
        ("500", "http", 500, "planned 500"),
        ("429", "http", 429, "planned 429"),
        ("stall", "stall", None, "no data for 0.5 s"),
        ("close", "disconnect", None, "cut short"),
        ("malformed", "malformed", None, "not JSON"),
        ("nested", "malformed", None, "not JSON"),
        ("badchunk", "stall", None, "no data for 0.5 s"),  # waited for the whole deadline: aiohttp never woke it
        ("error_event", "server_error", None, "planned error inside the stream"),
        ("no_done", "disconnect", None, "without its end"),
        ("json", "malformed", None, "not an event stream"),
    ],
)
def test_each_fault_is_a_failed_record_with_its_reason(fault, kind, status, message):
    with serve_in_thread(faults=[fault], itl_s=0.01, stall_s=30.0) as server:
        began = time.perf_counter()
        record = send(server.url, ids_request(6))
        took = time.perf_counter() - began
    assert not record.ok and record.error_kind == kind and record.status == status
    assert message in record.error and took < 10.0  # a hang would wait for the server's 30 s stall
    assert record.reason().startswith(kind)


def test_a_request_over_its_time_limit_is_a_timeout():
    with serve_in_thread(itl_s=0.2) as server:
        record = send(server.url, ids_request(20), limits=RequestLimits(timeout_s=0.5, stall_s=5.0))
    assert record.error_kind == "timeout" and "0.5 s" in record.error


def test_nothing_listening_is_a_connect_failure():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    record = send(f"http://127.0.0.1:{port}", ids_request())
    assert record.error_kind == "connect" and "cannot connect" in record.error


def test_the_model_list():
    async def names(url):
        async with open_session() as session:
            return await list_models(session, Target(url), None)

    with serve_in_thread(model="my-model") as server:
        assert asyncio.run(names(server.url)) == ["my-model"]
    with pytest.raises(KvbenchError, match="cannot reach"):
        asyncio.run(names("http://127.0.0.1:9"))
    with serve_in_thread(models_nested=True) as server, pytest.raises(KvbenchError, match="not answer with an OpenAI"):
        asyncio.run(names(server.url))  # nested past recursion: one line, not a RecursionError


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (dict(timeout_s=0), "request timeout limit"),
        (dict(stall_s=float("inf")), "request stall limit"),
        (dict(connect_s=-1), "request connect limit"),
    ],
)
def test_limits_out_of_range_are_refused(limits, message):
    with pytest.raises(KvbenchError, match=message):
        RequestLimits(**limits)


def test_a_target_refuses_an_unknown_api_and_a_bad_metrics_url():
    with pytest.raises(KvbenchError, match="unknown API"):
        Target("http://127.0.0.1:8000", api="embeddings")
    with pytest.raises(KvbenchError, match="metrics URL"):
        Target("http://127.0.0.1:8000", metrics_url="127.0.0.1:9/metrics")
    assert Target("http://127.0.0.1:8000/v1/completions").scrape_url == "http://127.0.0.1:8000/metrics"


def test_a_complete_stream_whose_body_never_ends_still_completes():
    with serve_in_thread(faults=["done_stall"], stall_s=30.0) as server:
        began = time.perf_counter()
        record = send(server.url, ids_request(3))
        took = time.perf_counter() - began
    assert record.ok and len(record.token_times) == 3 and took < 10.0


def test_more_output_than_max_tokens_is_set_aside():
    # usage claiming 20 tokens for max_tokens 5 is impossible: the request is flagged, not counted
    with serve_in_thread(tokens=20) as server:
        record = send(server.url, ids_request(5))
    assert not record.ok and record.error_kind == "malformed"
    assert "reports 20 output tokens for max_tokens 5: impossible" in record.error


def test_a_stream_of_huge_events_is_cut_at_a_size_scaled_from_max_tokens():
    with serve_in_thread(token_text_bytes=1 << 20) as server:  # 1 MiB of text per token event
        record = send(server.url, ids_request(5))
    assert not record.ok and record.error_kind == "malformed"
    assert "streamed more than 1 MiB for max_tokens 5: cut off" in record.error
    assert len(record.token_times) <= 2  # what was kept before the cut


def test_fewer_output_tokens_than_the_events_of_text_streamed_are_set_aside():
    with serve_in_thread(completion_tokens_claim=0) as server:
        record = send(server.url, ids_request(4))  # four events of text, then a usage of 0 tokens
    assert not record.ok and record.error_kind == "malformed"
    assert "reports 0 output tokens after streaming 4 events of text: impossible" in record.error


def test_more_prompt_tokens_than_the_prompt_can_hold_are_set_aside():
    with serve_in_thread(prompt_tokens_claim=1_000_000) as server:
        record = send(server.url, ids_request(5))  # four token ids
    assert not record.ok and record.error_kind == "malformed"
    assert "reports 1,000,000 prompt tokens for a prompt that holds at most 1,028: impossible" in record.error
    with serve_in_thread(prompt_tokens_claim=40) as server:  # a template's tokens on top: possible
        assert send(server.url, ids_request(5)).ok


def test_a_stream_that_never_stops_is_cut_at_max_tokens_plus_a_margin():
    with serve_in_thread(tokens=100_000) as server:
        began = time.perf_counter()
        record = send(server.url, ids_request(5))
    assert not record.ok and record.error_kind == "malformed" and "more than 26 token events" in record.error
    assert time.perf_counter() - began < 10 and len(record.token_times) == 27
