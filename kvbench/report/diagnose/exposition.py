"""Reading a live Prometheus endpoint: scraping, parsing the exposition into series, histogram quantiles."""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from dataclasses import dataclass

from kvbench.errors import KvbenchError


def scrape(url: str, timeout_s: float = 5.0) -> str:
    if not url.startswith(("http://", "https://")):
        raise KvbenchError(f"metrics URL {url!r}: expected http://HOST:PORT/metrics")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (user-given http URL)
            return response.read().decode("utf-8")
    except urllib.error.URLError as err:
        raise KvbenchError(f"cannot scrape {url}: {getattr(err, 'reason', err)}") from None
    except OSError as err:
        raise KvbenchError(f"cannot scrape {url}: {err}") from None


@dataclass
class Series:
    """The kvbench samples of one (engine, device)."""

    labels: dict[str, str]
    values: dict[str, float]
    buckets: list[tuple[float, float]]  # (le, cumulative count) of the allocation latency histogram

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.labels.items()))


_SERIES_LABELS = ("engine", "device", "instance", "exported_instance")


def parse_exposition(text: str) -> list[Series]:
    """kvbench series from Prometheus exposition text, grouped by their engine and device labels (and a fleet
    instance's, so that each instance is diagnosed on its own)."""
    from prometheus_client.parser import text_string_to_metric_families

    grouped: dict[tuple, Series] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as err:
        raise KvbenchError(f"not Prometheus exposition text: {err}") from None
    for family in families:
        for sample in family.samples:
            if not sample.name.startswith("kvbench_"):
                continue
            labels = {k: v for k, v in sample.labels.items() if k in _SERIES_LABELS}
            series = grouped.setdefault(tuple(sorted(labels.items())), Series(labels, {}, []))
            if sample.name.endswith("_bucket") and "le" in sample.labels:
                series.buckets.append((float(sample.labels["le"]), float(sample.value)))
            else:
                series.values[sample.name] = float(sample.value)
    for series in grouped.values():
        series.buckets.sort()
    return list(grouped.values())


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
