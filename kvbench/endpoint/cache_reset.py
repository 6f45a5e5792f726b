"""Emptying a server's prefix cache before a point, where the server offers a way, and saying what happened.

A cache warmed by earlier points (or the warm-up) makes a point look faster than a cold one (vLLM #52884), so a
point records whether the cache was reset, next to the hit rate it measured.

- vLLM: ``POST /reset_prefix_cache`` answers ``{"success": bool}``; it is served only when the server runs with
  ``VLLM_SERVER_DEV_MODE=1``, and refuses while blocks are still held (retried a few times).
- SGLang: ``POST /flush_cache`` (refused while requests are pending).
- kvbench and unknown servers: vLLM's route is tried, then SGLang's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from kvbench import json_input
from kvbench.endpoint.http_body import read_body
from kvbench.endpoint.openai import error_message, headers

ROUTES = {
    "vllm": ("/reset_prefix_cache",),
    "sglang": ("/flush_cache",),
    "kvbench": ("/reset_prefix_cache",),
    None: ("/reset_prefix_cache", "/flush_cache"),
}
NOT_OFFERED_HINT = {"vllm": "vLLM serves it only with VLLM_SERVER_DEV_MODE=1 in its environment"}


async def reset_prefix_cache(
    session: aiohttp.ClientSession,
    base_url: str,
    family: str | None,
    api_key: str | None = None,
    attempts: int = 3,
    pause_s: float = 0.5,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Ask the server to empty its prefix cache. Returns ``{"asked", "reset", "route", "detail"}``: ``reset``
    is True when the server confirmed it, False when it refused or does not offer it, None when it could not
    be asked."""
    tried = []
    for route in ROUTES.get(family, ROUTES[None]):
        url = base_url + route
        for attempt in range(attempts):
            try:
                async with session.post(
                    url, headers=headers(api_key), allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout_s)
                ) as response:
                    body, _ = await read_body(response, 4096)
                    status = response.status
            except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError) as err:
                return {
                    "asked": True,
                    "reset": None,
                    "route": route,
                    "detail": f"could not ask: {' '.join(str(err).split()) or type(err).__name__}",
                }
            if status in (404, 405):
                tried.append(f"{route} answered {status}")
                break
            if status == 200 and _confirmed(body):
                return {"asked": True, "reset": True, "route": route, "detail": "reset"}
            if attempt + 1 < attempts:  # refused while blocks or requests are held: try again shortly
                await asyncio.sleep(pause_s)
                continue
            why = error_message(body) or f"HTTP {status}"
            return {
                "asked": True,
                "reset": False,
                "route": route,
                "detail": f"refused after {attempts} attempts ({why})",
            }
    hint = NOT_OFFERED_HINT.get(family or "")
    return {
        "asked": True,
        "reset": False,
        "route": None,
        "detail": "not offered: " + "; ".join(tried) + (f" ({hint})" if hint else ""),
    }


def _confirmed(body: bytes) -> bool:
    """vLLM answers {"success": true|false}; SGLang answers plain text."""
    try:
        data = json_input.loads(body)
    except ValueError:
        return True
    return not (isinstance(data, dict) and data.get("success") is False)


NOT_ASKED = {"asked": False, "reset": None, "route": None, "detail": "not asked"}
