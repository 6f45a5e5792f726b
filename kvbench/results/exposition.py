"""Reading a live Prometheus endpoint: scraping, parsing the exposition into samples, histogram quantiles.

What the samples mean for one engine family (kvbench, vLLM, SGLang) is ``servers.py``'s business.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvbench.errors import KvbenchError
from kvbench.measure.http_fetch import FetchError, check_url, fetch_sync
from kvbench.values import printable

_HTML = re.compile(r"^\s*(<!doctype html|<html|<head|<body|<\?xml|<!--)", re.IGNORECASE)
MAX_BODY_BYTES = 32 << 20  # a /metrics page is kilobytes; more is not an exposition


def scrape(url: str, timeout_s: float = 5.0) -> str:
    """The body of ``url`` as text, read within ``timeout_s`` in all (redirects and body included); a
    one-line error when it cannot be read or is plainly not an exposition."""
    try:
        check_url(url)
    except FetchError:
        raise KvbenchError(f"metrics URL {printable(url, 120)!r}: expected http://HOST:PORT/metrics") from None
    try:
        result = fetch_sync(url, timeout_s=timeout_s, max_bytes=MAX_BODY_BYTES)
    except FetchError as err:
        raise KvbenchError(f"cannot scrape: {err}") from None
    if not result.ok:
        raise KvbenchError(f"cannot scrape {url}: HTTP {result.status} {printable(result.reason, 80)}")
    try:
        text = result.body.decode("utf-8")
    except UnicodeDecodeError:
        raise KvbenchError(f"{url} did not return UTF-8 text: not Prometheus exposition text") from None
    if _HTML.match(text):
        raise KvbenchError(f"{url} returned an HTML page, not Prometheus metrics; check the path (usually /metrics)")
    return text


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_samples(text: str, source: str = "the exposition") -> list[Sample]:
    """Every sample of Prometheus exposition text; a one-line error when the text is not an exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    if _HTML.match(text):
        raise KvbenchError(f"{source} is an HTML page, not Prometheus exposition text")
    try:
        families = list(text_string_to_metric_families(text))
        return [
            Sample(sample.name, dict(sample.labels), float(sample.value))  # a whole number of 309 digits overflows
            for family in families
            for sample in family.samples
        ]
    except Exception as err:
        raise KvbenchError(f"{source} is not Prometheus exposition text: {_first_line(str(err))}") from None


def _first_line(text: str, limit: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "unreadable"
    return printable(line, limit)  # a binary page's NUL and 0xFF bytes are written out, never sent to the terminal


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return buckets[-1][0]
