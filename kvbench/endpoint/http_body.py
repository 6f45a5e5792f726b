"""Reading a whole response body, up to a limit.

aiohttp's ``StreamReader.read(n)`` returns what has arrived so far (at most n bytes), not n bytes or the whole
body: a /metrics page or a JSON answer read with it can be cut anywhere. This reads until the body ends or the
limit is passed.
"""

from __future__ import annotations

import aiohttp


async def read_body(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The body (at most ``limit`` bytes) and whether it was longer than that (the rest is left unread)."""
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > limit:
            return bytes(body[:limit]), True
    return bytes(body), False
