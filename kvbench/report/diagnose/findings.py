"""What a diagnosis finds: findings with evidence and a suggestion, what it could not judge, what it measured
(and estimated), and the diagnosis that holds them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kvbench.report.diagnose.thresholds import Thresholds

SEVERITIES = ("critical", "warning", "info")


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    source: str  # the point ("contiguous C=10") or series ("engine=paged device=cpu") it came from
    evidence: str
    suggestion: str  # the remedies rendered for the engine family
    values: Mapping[str, Any]
    remedies: tuple[str, ...] = ()  # remedy keys (report/diagnose/remedies.py)
    family: str = "kvbench"  # engine family the suggestion speaks to: kvbench, vllm, sglang

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "values": dict(self.values), "remedies": list(self.remedies)}


@dataclass(frozen=True)
class FindingGroup:
    """One rule with one suggestion over every point or series it fired on: a reader acts once per group."""

    rule: str
    severity: str
    suggestion: str
    cases: tuple[tuple[str, str], ...]  # (source, evidence) of each finding, in the diagnosis' order


def grouped(findings: Iterable[Finding]) -> list[FindingGroup]:
    """Findings of one rule and suggestion together; the worst severity first, then the groups that fired on
    the most points, then the order the rules were checked in."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for finding in findings:
        groups.setdefault((finding.severity, finding.rule, finding.suggestion), []).append(finding)
    order = {severity: rank for rank, severity in enumerate(SEVERITIES)}
    ranked = sorted(
        enumerate(groups.items()), key=lambda item: (order.get(item[1][0][0], len(order)), -len(item[1][1]), item[0])
    )
    return [
        FindingGroup(rule, severity, suggestion, tuple((f.source, f.evidence) for f in members))
        for _, ((severity, rule, suggestion), members) in ranked
    ]


@dataclass(frozen=True)
class NotEvaluated:
    """A rule the data cannot decide: said plainly instead of guessed."""

    rule: str
    source: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Measurement:
    """A figure read from (or, when ``estimate``, derived by kvbench from) what the engine exposes."""

    source: str
    name: str
    value: float | None
    text: str
    estimate: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Diagnosis:
    source: str  # run directory or URL
    thresholds: Thresholds
    findings: list[Finding]
    checked: int  # points or series examined
    notes: list[str]
    not_evaluated: list[NotEvaluated] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def fired(self) -> bool:
        """A warning or critical finding (info findings are reported, never fail a check)."""
        return any(f.severity != "info" for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "thresholds": self.thresholds.as_dict(),
            "checked": self.checked,
            "fired": self.fired,
            "findings": [f.as_dict() for f in self.findings],
            "notes": self.notes,
            "not_evaluated": [n.as_dict() for n in self.not_evaluated],
            "measurements": [m.as_dict() for m in self.measurements],
        }


def sorted_findings(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.source, f.rule))
