"""What a diagnosis finds: findings with evidence and a suggestion, and the diagnosis that holds them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kvbench.report.diagnose.thresholds import Thresholds

SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    source: str  # the point ("contiguous C=10") or series ("engine=paged device=cpu") it came from
    evidence: str
    suggestion: str
    values: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "values": dict(self.values)}


@dataclass
class Diagnosis:
    source: str  # run directory or URL
    thresholds: Thresholds
    findings: list[Finding]
    checked: int  # points or series examined
    notes: list[str]

    @property
    def fired(self) -> bool:
        return bool(self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "thresholds": self.thresholds.as_dict(), "checked": self.checked,
                "fired": self.fired, "findings": [f.as_dict() for f in self.findings], "notes": self.notes}


def sorted_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.source, f.rule))


def pct(value: float) -> str:
    return f"{100 * value:.1f}%"
