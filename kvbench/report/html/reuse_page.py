"""The report of a reuse run: the prefix hit rate for each size of KV memory, and why."""

from __future__ import annotations

from kvbench import units
from kvbench.report.html.common import draw, figures_block, provenance_section, spec_table
from kvbench.report.html.page import Page, Section, Table, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.report.reuse_report import CURVE_FILE, curve_spec, reuse_plot, title
from kvbench.results.reuse_curve import ReuseCurve


def build(run: RunFiles) -> Page:
    curve = ReuseCurve.from_json(run.document)
    figures = draw(lambda: reuse_plot(curve, run.directory / CURVE_FILE))
    trace = curve.trace
    subtitle = (
        f"trace {trace.source}: {trace.prompt_tokens:,} prompt tokens, hash ids of "
        f"{trace.trace_block_size} tokens; simulated at the trace's arrival times"
    )
    sections = [Section("headline", "Verdict", [verdict(curve), curve_table(curve)])]
    if figures:
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    sections.append(Section("model", "What the simulation models", [Text(MODEL_NOTES, tone="note")]))
    sections.append(provenance_section(curve.meta.to_json(), run.files()))
    return Page("reuse", title(curve), subtitle, ["SIMULATED"], sections)


MODEL_NOTES = [
    "Requests arrive at the trace's times and are admitted first come, first served while their blocks fit; "
    "the cached prefix is pinned and the rest of prompt and output taken at once. Free blocks are reused "
    "least recently freed first, a request's tail first, as vLLM's prefix cache does; a request's blocks join "
    "the cache when it is scheduled. Service times are the GPU's roofline; prefills run one at a time.",
    "Left out: chunked prefill, preemption and recompute, routing across replicas, the KV of generated tokens "
    "being reused (a trace's hash ids cover prompts only). docs/REUSE.md says more.",
]


def verdict(curve: ReuseCurve) -> Verdict:
    asked = curve.asked
    unbounded = curve.unbounded.hit_rate_pct
    headline = (
        f"{units.pct(asked.hit_rate_pct)} of prompt tokens served from the prefix cache with "
        f"{units.human_bytes(asked.kv_bytes)} of KV memory; a cache that never evicts serves {units.pct(unbounded)}"
    )
    share = asked.hit_rate_pct / unbounded if unbounded else 1.0
    tone = "good" if share >= 0.9 else "warn"
    return Verdict(headline, tone, list(curve.findings))


def curve_table(curve: ReuseCurve) -> Table:
    return spec_table(
        curve_spec(curve),
        curve.points,
        "reuse-table",
        "Hit rate: prompt tokens served from cached KV blocks, of all prompt tokens (a refused request's "
        "are misses). "
        "Pinned: blocks held by running requests, which the cache cannot keep prefixes in.",
    )
