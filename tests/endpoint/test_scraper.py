"""Scraping beside the load at fixed ticks, and the prefix-cache reset, against small servers."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from fake_server import serve_in_thread

from kvbench.endpoint.cache_reset import reset_prefix_cache
from kvbench.endpoint.client import open_session
from kvbench.endpoint.scraper import MetricsScraper, fetch_metrics
from kvbench.errors import KvbenchError


def test_scrapes_come_at_their_ticks_and_the_last_one_on_stop():
    async def main(url):
        async with open_session() as session:
            scraper = MetricsScraper(session, url + "/metrics", time.perf_counter(), interval_s=0.05)
            scraper.start()
            await asyncio.sleep(0.32)
            scrapes = await scraper.stop()
            return scrapes

    with serve_in_thread() as server:
        scrapes = asyncio.run(main(server.url))
    # ticks every 50 ms from the start (a slow scrape skips ticks, never adds any) and one on stop
    assert 3 <= len(scrapes) <= 0.32 / 0.05 + 2 and all(s.error is None for s in scrapes)
    assert scrapes[0].states[0].family == "vllm" and scrapes[0].states[0].block_size == 16
    assert [s.elapsed_s for s in scrapes] == sorted(s.elapsed_s for s in scrapes)


class Pages:
    """A tiny server whose answers a test chooses, to check what the scraper and the reset make of them."""

    def __init__(self, routes):
        self.routes = routes

    async def __aenter__(self):
        app = web.Application()
        for method, path, handler in self.routes:
            app.router.add_route(method, path, handler)
        self.runner = web.AppRunner(app, shutdown_timeout=0.2)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (lambda r: web.Response(status=404), "HTTP 404"),
        (lambda r: web.Response(body=b"\xff\xfe"), "did not return UTF-8"),
        (lambda r: web.Response(status=302, headers={"Location": "http://127.0.0.1:9/"}), "HTTP 302"),
    ],
)
def test_a_page_that_is_not_metrics_is_a_one_line_error(handler, message):
    async def answer(request):
        return handler(request)

    async def main():
        async with Pages([("GET", "/metrics", answer)]) as url, open_session() as session:
            await fetch_metrics(session, url + "/metrics", 2.0)

    with pytest.raises(KvbenchError, match=message):
        asyncio.run(main())


def test_a_scrape_that_never_answers_times_out():
    async def slow(request):
        await asyncio.sleep(10)

    async def main():
        async with Pages([("GET", "/metrics", slow)]) as url, open_session() as session:
            began = time.perf_counter()
            scraper = MetricsScraper(session, url + "/metrics", began, interval_s=0.1, timeout_s=0.3)
            scrape = await scraper.scrape()
            return scrape, time.perf_counter() - began

    scrape, took = asyncio.run(main())
    assert scrape.error and "no answer within 0.3 s" in scrape.error and took < 5.0


def test_reset_where_offered_refused_or_absent():
    calls = {"n": 0}

    async def refuse_then_accept(request):
        calls["n"] += 1
        return web.json_response({"success": calls["n"] >= 2})

    async def always_refuse(request):
        return web.json_response({"success": False})

    async def flush(request):
        return web.Response(text="Cache flushed.")

    async def main():
        out = {}
        async with open_session() as session:
            async with Pages([("POST", "/reset_prefix_cache", refuse_then_accept)]) as url:
                out["vllm"] = await reset_prefix_cache(session, url, "vllm", pause_s=0.01)
            async with Pages([("POST", "/reset_prefix_cache", always_refuse)]) as url:
                out["refused"] = await reset_prefix_cache(session, url, "vllm", pause_s=0.01)
            async with Pages([("POST", "/flush_cache", flush)]) as url:
                out["sglang"] = await reset_prefix_cache(session, url, "sglang")
                out["unknown"] = await reset_prefix_cache(session, url, None)
            async with Pages([]) as url:
                out["absent"] = await reset_prefix_cache(session, url, "vllm")
            out["down"] = await reset_prefix_cache(session, "http://127.0.0.1:9", "vllm", timeout_s=2.0)
        return out

    out = asyncio.run(main())
    assert out["vllm"] == {"asked": True, "reset": True, "route": "/reset_prefix_cache", "detail": "reset"}
    assert calls["n"] == 2
    assert out["refused"]["reset"] is False and "refused after 3 attempts" in out["refused"]["detail"]
    assert out["sglang"]["reset"] is True and out["sglang"]["route"] == "/flush_cache"
    assert out["unknown"]["reset"] is True and out["unknown"]["route"] == "/flush_cache"  # vLLM's route tried first
    assert out["absent"]["reset"] is False and "not offered" in out["absent"]["detail"]
    assert "VLLM_SERVER_DEV_MODE=1" in out["absent"]["detail"]
    assert out["down"]["reset"] is None and "could not ask" in out["down"]["detail"]


async def _in_pieces(request, text: str, content_type: str, piece: int = 100):
    """A body written in small pieces with pauses, as a busy server's arrives: a reader that takes what has
    arrived so far for the whole body gets a torn one."""
    response = web.StreamResponse(headers={"Content-Type": content_type})
    await response.prepare(request)
    data = text.encode()
    for start in range(0, len(data), piece):
        await response.write(data[start : start + piece])
        await asyncio.sleep(0.002)
    await response.write_eof()
    return response


def test_bodies_that_arrive_in_pieces_are_read_whole():
    from fake_server import FakeConfig, FakeState, metrics_text

    from kvbench.endpoint.client import Target, list_models

    text = metrics_text(FakeState(FakeConfig()))  # about 2 KB of exposition

    async def metrics(request):
        return await _in_pieces(request, text, "text/plain")

    async def refuse(request):
        return await _in_pieces(request, '{"success": false}', "application/json", 5)

    async def models(request):
        return await _in_pieces(request, '{"data": [{"id": "m1"}, {"id": "m2"}]}', "application/json", 7)

    routes = [("GET", "/metrics", metrics), ("POST", "/reset_prefix_cache", refuse), ("GET", "/v1/models", models)]

    async def main():
        async with Pages(routes) as url, open_session() as session:
            body = await fetch_metrics(session, url + "/metrics", 5.0)
            reset = await reset_prefix_cache(session, url, "vllm", attempts=1)
            models = await list_models(session, Target(url), None)
            return body, reset, models

    body, reset, models = asyncio.run(main())
    assert body == text
    assert reset["reset"] is False and "refused" in reset["detail"]  # a torn {"success": false} is no yes
    assert models == ["m1", "m2"]
