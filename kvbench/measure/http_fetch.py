"""One HTTP(S) request to a server we do not trust to behave: a deadline for the whole exchange (connect, every
redirect, headers and body, not one socket read), redirects followed by hand (http and https only, a loop named
as one, at most a few hops), a cap on the body, and a body that ends before its Content-Length refused.

Every failure is one :class:`FetchError` line naming the URL. :func:`fetch` is the async form (give it an
:func:`open_session` to reuse connections, as a load generator does); :func:`fetch_sync` runs one fetch from
synchronous code (``kvbench diagnose --url``, ``kvbench watch``).
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urljoin, urlsplit

from kvbench.errors import KvbenchError
from kvbench.values import printable

T = TypeVar("T")

if TYPE_CHECKING:
    import aiohttp

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_REDIRECTS = 5
DEFAULT_MAX_BYTES = 32 << 20
_SCHEMES = ("http", "https")
_REDIRECTS = (301, 302, 303, 307, 308)


class FetchError(KvbenchError):
    """A request that could not be completed, said in one line."""


@dataclass(frozen=True)
class FetchResult:
    url: str  # the URL that answered (after redirects)
    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self) -> str:
        """The body as UTF-8 text; a one-line error when it is not."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError:
            raise FetchError(f"{self.url} did not return UTF-8 text") from None


def check_url(url: str) -> str:
    """``url`` when it is an absolute http(s) URL with a host, else a one-line error."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port out of range or not a number
    except ValueError as err:
        raise FetchError(f"{url!r} is not a valid URL: {err}") from None
    if parts.scheme.lower() not in _SCHEMES or not parts.hostname:
        raise FetchError(f"{url!r} is not an http:// or https:// URL with a host")
    return url


def open_session(connections: int = 100) -> aiohttp.ClientSession:
    """A client session for :func:`fetch`: no proxy or netrc from the environment, no cookies kept, at most
    ``connections`` open at once. Close it (``async with``) when done."""
    import aiohttp

    return aiohttp.ClientSession(
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=None),
    )


async def fetch(
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    json: Any = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_redirects: int = DEFAULT_MAX_REDIRECTS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    session: aiohttp.ClientSession | None = None,
) -> FetchResult:
    """``method url`` and its whole answer within ``timeout_s``; the answer of any status is returned (the
    caller judges a 404), a transport failure or a misbehaving server is a :class:`FetchError`."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number, got {timeout_s}")
    check_url(url)
    if session is None:
        async with open_session(connections=1) as own:
            return await fetch(
                url,
                method=method,
                headers=headers,
                body=body,
                json=json,
                timeout_s=timeout_s,
                max_redirects=max_redirects,
                max_bytes=max_bytes,
                session=own,
            )
    try:
        return await asyncio.wait_for(
            _follow(session, url, method, headers, body, json, max_redirects, max_bytes), timeout_s
        )
    except asyncio.TimeoutError:
        raise FetchError(f"{url} did not answer within {timeout_s:g} s") from None


async def _follow(
    session, url: str, method: str, headers, body, json, max_redirects: int, max_bytes: int
) -> FetchResult:
    import aiohttp

    seen = [url]
    while True:
        try:
            async with session.request(
                method, url, headers=headers, data=body, json=json, allow_redirects=False, auto_decompress=True
            ) as response:
                if response.status in _REDIRECTS and "Location" in response.headers:
                    target = _redirect_target(seen, response.headers["Location"], max_redirects)
                    if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                        method, body, json = "GET", None, None  # as browsers and curl do
                    seen.append(target)
                    url = target
                    continue
                data = await _read_body(response, max_bytes, seen[0])
                return FetchResult(
                    str(response.url),
                    response.status,
                    response.reason or "",
                    {k: v for k, v in response.headers.items()},
                    data,
                )
        except FetchError:
            raise
        except aiohttp.ClientPayloadError as err:  # e.g. fewer bytes than the Content-Length, then closed
            cause = getattr(err.__cause__, "message", None) or err
            raise FetchError(f"{seen[0]}: the body was cut short ({_first_line(cause)})") from None
        except aiohttp.ClientResponseError as err:  # a status line or headers that are not HTTP
            raise FetchError(f"{seen[0]} did not answer in HTTP: {_first_line(err.message or err)}") from None
        except aiohttp.ClientConnectorError as err:
            raise FetchError(f"cannot connect to {_where(url)}: {_first_line(err.os_error.strerror or err)}") from None
        except aiohttp.ServerDisconnectedError:
            raise FetchError(f"{seen[0]}: the server closed the connection without a complete answer") from None
        except (aiohttp.ClientError, OSError, ValueError) as err:
            raise FetchError(f"cannot fetch {seen[0]}: {_first_line(err)}") from None


def _redirect_target(seen: list[str], location: str, max_redirects: int) -> str:
    target = urljoin(seen[-1], location)
    start = seen[0]
    scheme = urlsplit(target).scheme.lower()
    if scheme not in _SCHEMES:
        raise FetchError(
            f"{start} redirects to {scheme or 'a non-http'}:// ({_shorten(target)}): only http and https are followed"
        )
    check_url(target)
    if target in seen:
        raise FetchError(f"{start} redirects in a loop ({len(seen)} hop(s) back to {_shorten(target)})")
    if len(seen) > max_redirects:
        raise FetchError(f"{start} redirects more than {max_redirects} times")
    return target


async def _read_body(response, max_bytes: int, url: str) -> bytes:
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        raise FetchError(f"{url} announces {declared:,} bytes, more than the {max_bytes:,} read at most")
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > max_bytes:
            raise FetchError(f"{url} sent more than {max_bytes:,} bytes")
        chunks.append(chunk)
    data = b"".join(chunks)
    if (
        declared is not None
        and len(data) < declared
        and response.headers.get("Content-Encoding") is None
        and response.method != "HEAD"
    ):
        raise FetchError(
            f"{url}: the body ended after {len(data):,} of the {declared:,} bytes its Content-Length announced"
        )
    return data


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``awaitable``'s result within ``seconds`` (else TimeoutError), awaited in this task where Python has
    ``asyncio.timeout``: ``wait_for`` runs it in a task of its own, which can swallow a cancellation."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


def fetch_sync(url: str, **kwargs: Any) -> FetchResult:
    """:func:`fetch` from synchronous code (no event loop may be running in this thread)."""
    return asyncio.run(fetch(url, **kwargs))


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def _shorten(text: str, limit: int = 80) -> str:
    return printable(text, limit)


def _first_line(err: object) -> str:
    """An error's text on one line (aiohttp's parser errors span several, with a caret line), safe to print."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip() and set(line.strip()) != {"^"}]
    return printable(" ".join(lines), limit=160) if lines else type(err).__name__
