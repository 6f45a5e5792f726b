"""The HTTP client for servers we do not trust, against real servers on 127.0.0.1 that misbehave on purpose:
every failure is one line, and no server can make a fetch last past its deadline."""

from __future__ import annotations

import asyncio
import time

import pytest
from bad_servers import RawServer, raw, redirects, respond, trickle

from kvbench.measure.http_fetch import FetchError, fetch, fetch_sync, open_session

EXPOSITION = "# TYPE x gauge\nx 1\n"


def _error(url: str, **kwargs) -> str:
    with pytest.raises(FetchError) as caught:
        fetch_sync(url, **kwargs)
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    return message


def test_a_plain_answer_is_read_whole():
    with RawServer(respond(EXPOSITION)) as server:
        result = fetch_sync(server.url())
    assert (result.status, result.ok, result.text()) == (200, True, EXPOSITION)
    assert result.url == server.url() and result.headers["Content-Type"].startswith("text/plain")


def test_a_body_trickling_one_line_every_2_s_ends_at_the_deadline_of_the_whole_fetch():
    """Each socket read returns within 2 s, so a per-read timeout of 5 s never fires; the fetch's does."""
    with RawServer(trickle(every_s=0.5)) as server:
        start = time.monotonic()
        message = _error(server.url(), timeout_s=2.0)
        took = time.monotonic() - start
    assert message == f"{server.url()} did not answer within 2 s"
    assert 1.9 < took < 3.5, took


@pytest.mark.parametrize(
    "wire, said",
    [
        (b"HTTPX/9 banana\r\n\r\n", "Bad status line: Expected HTTP/, RTSP/ or ICE/: b'HTTPX/9 banana'"),
        (b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n", "Bad status line"),
        (b"\x00\x01\x02garbage\r\n\r\n", "Bad status line"),
        (b"HTTP/1.1 200 OK\r\nX-\x1b[31m: 1\r\n\r\n", "Invalid header token: b'X-\\x1b[31m: 1'"),
    ],
)
def test_a_malformed_status_line_or_header_is_one_line(wire, said):
    with RawServer(raw(wire)) as server:
        message = _error(server.url())
    assert message.startswith(f"{server.url()} did not answer in HTTP: {said}"), message
    assert "\x1b" not in message  # a raw escape never reaches the terminal


def test_a_body_shorter_than_its_content_length_is_refused():
    with RawServer(respond(EXPOSITION, content_length=1000)) as server:
        message = _error(server.url())
    assert (
        message == f"{server.url()}: the body was cut short (Not enough data to satisfy content length header "
        "(received 19 of 1000 bytes).)"
    )


def test_a_body_past_the_cap_is_refused_whether_announced_or_not():
    with RawServer(respond("x" * 5000)) as server:
        assert (
            _error(server.url(), max_bytes=1000) == f"{server.url()} announces 5,000 bytes, more than the "
            "1,000 read at most"
        )
    with RawServer(trickle(b"x" * 600, every_s=0.01)) as server:  # chunked: no length announced
        assert _error(server.url(), max_bytes=1000) == f"{server.url()} sent more than 1,000 bytes"


def test_a_redirect_loop_is_named_as_one():
    with RawServer(redirects({"/metrics": "/a", "/a": "/b", "/b": "/metrics"})) as server:
        message = _error(server.url())
    assert message == f"{server.url()} redirects in a loop (3 hop(s) back to {server.url()})"


def test_redirects_are_capped():
    with RawServer(redirects({f"/{i}": f"/{i + 1}" for i in range(20)})) as server:
        assert _error(server.url("/0"), max_redirects=3) == f"{server.url('/0')} redirects more than 3 times"


@pytest.mark.parametrize("location", ["ftp://127.0.0.1/metrics", "file:///etc/passwd", "gopher://x/"])
def test_a_redirect_off_http_is_not_followed(location):
    with RawServer(redirects({"/metrics": location})) as server:
        message = _error(server.url())
    scheme = location.split(":")[0]
    assert message.startswith(f"{server.url()} redirects to {scheme}:// ({location}): only http and https"), message


def test_a_redirect_within_http_is_followed():
    with RawServer(redirects({"/metrics": "/real"})) as target, RawServer(respond(EXPOSITION)) as real:
        with RawServer(redirects({"/metrics": real.url("/m")})) as first:
            result = fetch_sync(first.url())
        assert (result.status, result.url, result.text()) == (200, real.url("/m"), EXPOSITION)
        assert fetch_sync(target.url()).status == 404  # the caller judges a status


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "127.0.0.1:9400/metrics", "http://", "http://h:99999/"])
def test_only_http_urls_with_a_host_are_fetched(url):
    assert "URL" in _error(url)


def test_nothing_listening_is_one_line():
    with RawServer(respond("")) as server:
        port = server.port
    message = _error(f"http://127.0.0.1:{port}/metrics")
    assert message.startswith(f"cannot connect to 127.0.0.1:{port}: "), message


def test_one_session_serves_many_fetches_at_once():
    """The load generator's use: one session, requests in flight together, each with its own deadline."""

    async def run(url: str) -> list[int]:
        async with open_session() as session:
            results = await asyncio.gather(
                *(fetch(url, session=session, method="POST", json={"i": i}) for i in range(8))
            )
        return [r.status for r in results]

    with RawServer(respond(EXPOSITION)) as server:
        assert asyncio.run(run(server.url())) == [200] * 8
    assert all(request.startswith(b"POST /metrics") for request in server.requests)
