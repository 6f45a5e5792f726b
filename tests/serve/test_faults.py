"""Faults: clients that vanish, a crowd on a small pool, a shutdown under load. No KV block may leak, no request may
end without an answer (a completion or an error), and the server must still answer afterwards."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.sampling import SamplingParams
from kvbench.serve.connections import ConnectionLimits
from kvbench.studies.local_model import build_engine

from .conftest import assert_idle_and_drained, engine_of, running_server


@pytest.fixture(scope="module")
def long_server(tiny_model):
    """Requests long enough (2,000 tokens) that a client can leave while they run."""
    with running_server(tiny_model, num_blocks=512, max_len=2048) as server:
        yield server


def test_the_server_info_pairs_the_served_model_with_the_engine_process_facts(long_server):
    info = long_server.server.info
    assert (info.model.name, info.model.max_len, info.model.tokenizer) == ("tiny", 2048, None)
    assert (info.facts.name, info.facts.max_len) == (info.model.name, info.model.max_len)
    assert (info.facts.engine, info.facts.num_blocks, info.facts.block_size) == ("paged", 512, 16)
    assert info.facts.pid == engine_of(long_server).pid


def _aborted(server) -> int:
    return engine_of(server).stats.aborted


async def _wait_for(predicate, seconds: float = 30.0) -> bool:
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


def test_a_client_that_leaves_mid_stream_frees_its_blocks_at_once(long_server):
    before = _aborted(long_server)
    finished = engine_of(long_server).stats.finished

    async def leave_after_first_event():
        async with aiohttp.ClientSession() as session:
            body = {"prompt": [1, 2, 3], "max_tokens": 2000, "ignore_eos": True, "stream": True}
            response = await session.post(long_server.url + "/v1/completions", json=body)
            first = await response.content.readuntil(b"\n\n")
            assert json.loads(first.removeprefix(b"data: "))["choices"][0]["token_ids"]
            response.close()  # the connection goes away mid-stream
        assert await _wait_for(lambda: _aborted(long_server) == before + 1)

    asyncio.run(leave_after_first_event())
    assert_idle_and_drained(long_server)
    assert engine_of(long_server).stats.finished == finished  # withdrawn, not run out
    _still_answers(long_server)


def test_a_client_that_leaves_a_non_streamed_request_frees_its_blocks(long_server):
    before = _aborted(long_server)
    body = json.dumps({"prompt": [4, 5, 6], "max_tokens": 2000, "ignore_eos": True}).encode()
    host, port = "127.0.0.1", int(long_server.url.rsplit(":", 1)[1])
    with socket.create_connection((host, port), timeout=10) as raw:
        raw.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
    assert asyncio.run(_wait_for(lambda: _aborted(long_server) == before + 1))
    assert_idle_and_drained(long_server)
    _still_answers(long_server)


def _still_answers(server) -> None:
    async def ask():
        async with aiohttp.ClientSession() as session:
            async with session.post(
                server.url + "/v1/completions", json={"prompt": [7, 8], "max_tokens": 3, "ignore_eos": True}
            ) as response:
                return response.status, await response.json()

    status, body = asyncio.run(ask())
    assert status == 200 and len(body["choices"][0]["token_ids"]) == 3


async def _crowd(url: str, prompts: list[list[int]], max_tokens: int, stream: bool) -> list[tuple[int, dict]]:
    """All requests at once; each answer as (status, final body or the error body)."""

    async def one(session, prompt):
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}
        async with session.post(url + "/v1/completions", json=body) as response:
            if not stream or response.status != 200:
                return response.status, await response.json()
            tokens, events = [], (await response.read()).decode().split("\n\n")
            assert events[-2:] == ["data: [DONE]", ""]
            for event in events[:-2]:
                data = json.loads(event.removeprefix("data: "))
                if "error" in data:
                    return data["error"]["code"], data
                tokens += data["choices"][0]["token_ids"]
            return 200, {"choices": [{"token_ids": tokens, "finish_reason": data["choices"][0]["finish_reason"]}]}

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        return await asyncio.gather(*(one(session, p) for p in prompts))


PROMPT, OUTPUT = 8, 40  # 48 token slots: 3 blocks of 16, so a pool of 30 blocks holds 10 such requests


def _prompts(count: int) -> list[list[int]]:
    return [[(7 * i + j) % 500 + 1 for j in range(PROMPT)] for i in range(count)]


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
def test_100_concurrent_requests_on_a_paged_pool_that_holds_10_all_finish(tiny_model, stream):
    prompts = _prompts(100)
    engine = build_engine(tiny_model, EngineConfig(block_size=16, num_blocks=512, max_len=64))
    expected = engine.generate(prompts[:5], SamplingParams(max_tokens=OUTPUT, ignore_eos=True))
    with running_server(tiny_model, num_blocks=30, max_len=64) as server:
        answers = asyncio.run(_crowd(server.url, prompts, OUTPUT, stream))
        assert [status for status, _ in answers] == [200] * 100
        tokens = [body["choices"][0]["token_ids"] for _, body in answers]
        assert all(len(t) == OUTPUT for t in tokens) and tokens[:5] == expected
        assert engine_of(server).stats.preemptions > 0  # the pool ran dry: requests were preempted and recomputed
        assert_idle_and_drained(server)
        _still_answers(server)


def test_100_concurrent_requests_on_a_contiguous_pool_that_holds_10_wait_their_turn(tiny_model):
    with running_server(tiny_model, engine="contiguous", num_blocks=30, max_len=48) as server:
        answers = asyncio.run(_crowd(server.url, _prompts(100), OUTPUT, stream=True))
        assert [status for status, _ in answers] == [200] * 100
        assert engine_of(server).stats.peak_running == 10  # ten max-len reservations, never more
        assert_idle_and_drained(server)


def test_contiguous_reject_admission_refuses_with_503_and_answers_everyone(tiny_model):
    with running_server(tiny_model, engine="contiguous", num_blocks=30, max_len=48, admission="reject") as server:
        for stream in (False, True):
            answers = asyncio.run(_crowd(server.url, _prompts(100), OUTPUT, stream))
            statuses = [status for status, _ in answers]
            assert set(statuses) == {200, 503} and statuses.count(200) >= 10
            for status, body in answers:
                if status == 503:
                    error = body["error"]
                    assert error["code"] == 503 and "cannot hold this request now" in error["message"]
                else:
                    assert len(body["choices"][0]["token_ids"]) == OUTPUT
            assert_idle_and_drained(server)
        _still_answers(server)


def test_shutdown_under_load_answers_every_request_and_drains(tiny_model):
    """Past the grace period every request still running is withdrawn and answered with a 503."""
    with running_server(tiny_model, num_blocks=512, max_len=2048) as server:

        async def load_then_stop():
            async def one(session, index, stream):
                body = {"prompt": [index + 1, 2, 3], "max_tokens": 1500, "ignore_eos": True, "stream": stream}
                async with session.post(server.url + "/v1/completions", json=body) as response:
                    return response.status, await response.read()

            async with aiohttp.ClientSession() as session:
                tasks = [asyncio.create_task(one(session, i, i % 2 == 0)) for i in range(6)]
                await _wait_for(lambda: engine_of(server).stats.running == 6)
                stop = asyncio.run_coroutine_threadsafe(server.server.shutdown(0.2), server.loop)
                report = await asyncio.wrap_future(stop)
                return report, await asyncio.gather(*tasks)

        report, answers = asyncio.run(load_then_stop())
        assert report.aborted == 6 and report.finished_in_grace == 0
        for index, (status, raw) in enumerate(answers):
            if index % 2 == 0:  # streamed: headers went out with the first token, the error comes as an event
                events = raw.decode().split("\n\n")
                assert status == 200 and events[-2] == "data: [DONE]"
                error = json.loads(events[-3].removeprefix("data: "))["error"]
            else:
                assert status == 503
                error = json.loads(raw)["error"]
            assert error["code"] == 503 and "shut down before this request finished" in error["message"]


def test_an_engine_that_fails_answers_500_then_503_in_one_line_and_stops_the_server(tiny_model, capfd):
    """A failure inside the engine process (here: a message it cannot understand) fails the requests in flight
    with its reason, refuses new ones, and ends the server; the reason is one line, never a traceback."""
    from kvbench.serve.engine_client import EngineDied

    server = running_server(tiny_model, num_blocks=512, max_len=2048)
    with pytest.raises(EngineDied, match="unknown kind 'bogus'"), server as running:
        engine = engine_of(running)

        async def scenario():
            async with aiohttp.ClientSession() as session:
                body = {"prompt": [1, 2, 3], "max_tokens": 1500, "ignore_eos": True, "stream": True}
                async with session.post(running.url + "/v1/completions", json=body) as response:
                    await response.content.readline()  # the first event: the request runs
                    running.call(engine._send, {"t": "bogus"})
                    raw = (await response.read()).decode()
                assert await _wait_for(lambda: engine.dead.is_set())
                async with session.post(running.url + "/v1/completions", json={**body, "stream": False}) as late:
                    late_status, late_body = late.status, await late.json()
                async with session.get(running.url + "/health") as health:
                    return raw, late_status, late_body, health.status

        raw, late_status, late_body, health_status = asyncio.run(scenario())
        error = json.loads(raw.split("\n\n")[-3].removeprefix("data: "))["error"]
        assert error["code"] == 500 and "unknown kind 'bogus'" in error["message"]
        assert "\n" not in error["message"] and "engine_messages.py:" in error["message"]  # one line, with where
        assert late_status == 503 and "engine process has stopped" in late_body["error"]["message"]
        assert health_status == 503
        assert not engine.alive and engine.process.returncode == 1
    assert "Traceback" not in capfd.readouterr().err  # the engine process writes no traceback of its own


def test_a_client_that_reads_slowly_still_gets_every_token_in_order(long_server):
    """Events go out from the engine client's callback until the client's buffer fills; then the handler's awaited
    writes take over (they wait for the client). Either way nothing is lost, doubled or reordered."""
    body = {"prompt": [9, 8, 7], "max_tokens": 2000, "ignore_eos": True, "return_token_ids": True, "temperature": 0}
    expected = _post(long_server, body)["choices"][0]["token_ids"]
    finished = engine_of(long_server).stats.finished
    payload = json.dumps({**body, "stream": True}).encode()
    host, port = long_server.url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's buffer fills
        sock.connect((host, int(port)))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(payload), payload)
        )
        assert asyncio.run(_wait_for(lambda: engine_of(long_server).stats.finished > finished))  # ran unread
        raw = b""
        while chunk := sock.recv(1 << 16):
            raw += chunk
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0] and b"transfer-encoding: chunked" in head.lower()
    stream, rest = b"", chunked
    while True:  # the HTTP chunks, each one whole
        size, _, rest = rest.partition(b"\r\n")
        if int(size, 16) == 0:
            break
        stream, rest = stream + rest[: int(size, 16)], rest[int(size, 16) + 2 :]
    events = stream.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    tokens = [t for e in events[:-2] for t in json.loads(e.removeprefix("data: "))["choices"][0]["token_ids"]]
    assert tokens == expected
    assert_idle_and_drained(long_server)


def _post(server, body: dict) -> dict:
    async def ask():
        async with aiohttp.ClientSession() as session:
            async with session.post(server.url + "/v1/completions", json=body) as response:
                assert response.status == 200
                return await response.json()

    return asyncio.run(ask())


SMALL_LIMITS = ConnectionLimits(max_connections=8, header_timeout_s=1.0, body_timeout_s=1.0)


@pytest.fixture(scope="module")
def strict_server(tiny_model):
    """A server with tight limits on clients, so that the tests of them take seconds."""
    with running_server(tiny_model, limits=SMALL_LIMITS) as server:
        yield server


def _connect(server) -> socket.socket:
    port = int(server.url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (at most 10 s)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_answer(sock: socket.socket) -> bytes:
    """One answer with a Content-Length (the server may keep reading what is left of the body for a while)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))[15:])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_connection_whose_headers_never_end_is_closed_after_the_header_timeout(strict_server):
    sockets = [_connect(strict_server) for _ in range(5)]
    for sock in sockets:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and nothing more
    for sock in sockets:
        assert _read_all(sock) == b""  # closed by the server, within the socket's 10 s timeout
        sock.close()
    assert _wait_sync(lambda: strict_server.server.site.open_connections == 0)
    _still_answers(strict_server)


def test_a_body_shorter_than_its_content_length_is_answered_408(strict_server):
    with _connect(strict_server) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"prompt": [1'
        )
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"did not arrive within 1s" in answer
    assert_idle_and_drained(strict_server)
    _still_answers(strict_server)


def test_connections_past_the_limit_are_answered_503_and_closed(strict_server):
    held = [_connect(strict_server) for _ in range(SMALL_LIMITS.max_connections)]
    try:
        assert _wait_sync(lambda: strict_server.server.site.open_connections == SMALL_LIMITS.max_connections)
        refused_before = strict_server.server.site.refused_connections
        with _connect(strict_server) as extra:
            answer = _read_all(extra)
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 503
        assert strict_server.server.site.refused_connections == refused_before + 1
    finally:
        for sock in held:
            sock.close()
    assert _wait_sync(lambda: strict_server.server.site.open_connections == 0)
    _still_answers(strict_server)


def _wait_sync(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_a_body_that_cannot_be_decoded_is_a_400_not_a_500(strict_server):
    """Content-Encoding gzip over bytes that are not gzip: the client's fault, answered so."""
    body = b"this is not gzip at all"
    with _connect(strict_server) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]
    assert b"the request body cannot be read" in answer
    _still_answers(strict_server)
