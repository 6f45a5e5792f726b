"""A sweep's ``summary.json``, typed: the run's meta, the article's table (or, for servers over HTTP, the
``--find-max`` searches), the verdict in words and the points. ``to_json`` is the file as the sweep writes it (the
results schema's summary document)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.results.article import ArticleRow
from kvbench.results.find_max_search import EndpointSummary
from kvbench.results.point import Point
from kvbench.results.run_meta import RunMeta
from kvbench.results.schema import SCHEMA_VERSION

KIND = "sweep"


@dataclass(frozen=True)
class SweepSummary:
    meta: RunMeta
    # the points as written: the waterfall, the diagnosis and the plots read their JSON form (:attr:`typed_points`)
    points: list[dict[str, Any]] = field(default_factory=list)
    article_table: list[ArticleRow] | None = None  # None: the summary holds no table
    findings: list[str] | None = None  # the verdict's headline and sentences (None: not recorded)
    endpoint: EndpointSummary | None = None  # servers over HTTP (sweep --target): the searches and the SLO
    schema_version: int = SCHEMA_VERSION

    @property
    def typed_points(self) -> list[Point]:
        return [Point.from_json(point) for point in self.points]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": self.schema_version, "kind": KIND, "meta": self.meta.to_json()}
        if self.endpoint is not None:
            out["endpoint"] = self.endpoint.to_json()
        if self.article_table is not None:
            out["article_table"] = [row.to_json() for row in self.article_table]
        if self.findings is not None:
            out["findings"] = self.findings
        out["points"] = self.points
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepSummary:
        table = data.get("article_table")
        findings = data.get("findings")
        endpoint = data.get("endpoint")
        return cls(
            meta=RunMeta.from_json(data.get("meta") or {}),
            points=list(data.get("points") or []),
            article_table=[ArticleRow.from_json(row) for row in table] if table is not None else None,
            findings=list(findings) if findings is not None else None,
            endpoint=EndpointSummary.from_json(endpoint) if isinstance(endpoint, Mapping) else None,
            schema_version=data.get("schema_version", SCHEMA_VERSION),
        )
