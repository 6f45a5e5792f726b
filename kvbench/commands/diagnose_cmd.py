"""``kvbench diagnose``: find KV-cache trouble in a run directory or a live metrics endpoint."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from kvbench import units
from kvbench.commands._flags import JSON, METRICS_URL
from kvbench.commands._options import output_file
from kvbench.errors import KvbenchError
from kvbench.fileio import json_text, write_text_atomic
from kvbench.report.diagnose import (
    Diagnosis,
    diagnose_run,
    diagnose_timeline,
    diagnose_url,
    load_thresholds,
    rules_yaml,
    timeline_path,
)
from kvbench.report.diagnose.findings import grouped
from kvbench.report.diagnose.thresholds import KEYS, Thresholds, parse_assignments

_DEFAULTS = Thresholds()

HELP = f"""Find KV-cache trouble in a run, a watch timeline or a live metrics endpoint.

Diagnose the KV cache: rules over a run's results (RUN: a run directory or summary.json), a timeline
recorded by `kvbench watch` (RUN: its timeline.jsonl or folder), or a live Prometheus endpoint (--metrics-url
http://127.0.0.1:PORT/metrics) of kvbench, vLLM or SGLang; each finding with its evidence and a suggestion
in the words of the engine diagnosed (kvbench flags for kvbench, vLLM's or SGLang's launch options for theirs).

Rules and defaults (from the seed article, plus what the data makes obvious): fragmentation >
{_DEFAULTS.fragmentation:g}; free blocks < {units.share(_DEFAULTS.free_blocks, 0)} of the pool; block allocation
latency p99 > {_DEFAULTS.alloc_latency_p99_ms:g} ms; more than {_DEFAULTS.preemptions_per_request:g} preemptions
per completed request; reservation + internal > {units.share(_DEFAULTS.reservation_waste, 0)} of the pool; a KV
budget that caps concurrency (OOM, fewer requests running than offered, or requests waiting while few blocks are
free); requests queueing while KV usage is below {units.share(_DEFAULTS.low_kv_usage, 0)} (the scheduler's batch
cap; a warning when a timeline shows the queue growing); a prefix-cache hit rate below min_prefix_hit_rate (off by
default). For a server point that recorded its requests' cached tokens and KV events (sweep --target, --kv-events):
eviction thrash above max_thrash_share ({_DEFAULTS.max_thrash_share:g}), a shared prefix shorter than one block,
prefix caching off while prompts share prefixes, and a hit rate more than max_reuse_gap
({_DEFAULTS.max_reuse_gap:g}) below what an unbounded cache serves the same requests. A rule the engine's metrics
cannot decide (vLLM exposes no fragmentation) is listed as not evaluated, with kvbench's estimate of paging's
internal waste (half a block per running request) marked as an estimate. Thresholds come from --thresholds FILE
(TOML: the keys at the top or in a table named thresholds), then each --threshold KEY=VALUE; the keys:
{", ".join(KEYS)}.

--emit-prometheus-rules FILE writes the rules over kvbench's metrics as Prometheus alerting rules (YAML);
alone, it needs no input. Exit codes: 0 (with --check: no warning or critical finding), 1 with --check when
one fired (info findings never fail), 2 unusable input.
"""

THRESHOLD_HELP = (
    "A threshold, repeatable; the keys (those of --thresholds FILE) with their defaults: "
    + ", ".join(described.shown() for described in KEYS.values())
    + "."
)

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def register(app: typer.Typer) -> None:
    app.command("diagnose", help=HELP)(diagnose)


def diagnose(
    run: Path | None = typer.Argument(None, help="Run directory, summary.json, or a kvbench watch timeline (.jsonl)."),
    url: str | None = METRICS_URL(
        None, "Scrape a live kvbench, vLLM or SGLang endpoint, e.g. http://127.0.0.1:8000/metrics."
    ),
    check: bool = typer.Option(False, "--check", help="Exit 1 when any rule fires (for CI)."),
    as_json: bool = JSON(False, "Print the diagnosis as JSON on stdout."),
    thresholds_file: Path | None = typer.Option(None, "--thresholds", help="TOML file of thresholds."),
    threshold: list[str] | None = typer.Option(None, "--threshold", metavar="KEY=VALUE", help=THRESHOLD_HELP),
    emit_rules: str | None = typer.Option(
        None, "--emit-prometheus-rules", help="Write Prometheus alerting rules (YAML) here."
    ),
) -> None:
    try:
        overrides = parse_assignments(threshold or ())
    except KvbenchError as err:
        raise KvbenchError(f"--threshold {err}") from None
    thresholds = load_thresholds(thresholds_file, **overrides)
    if run is not None and url is not None:
        raise KvbenchError("give a run directory or --metrics-url, not both")
    if run is None and url is None and emit_rules is None:
        raise KvbenchError(
            "nothing to diagnose: give a run directory, --metrics-url http://HOST:PORT/metrics, or "
            "--emit-prometheus-rules FILE"
        )
    rules_path = output_file(emit_rules, "--emit-prometheus-rules")
    console = Console(stderr=as_json)
    if rules_path is not None:
        write_text_atomic(rules_path, rules_yaml(thresholds))
        console.print(f"wrote Prometheus alerting rules to {rules_path}")
    if url is not None:
        diagnosis = diagnose_url(url, thresholds)
    elif run is not None:
        diagnosis = _diagnose_path(run, thresholds)
    else:
        return
    if as_json:
        typer.echo(json_text(diagnosis.as_dict()))
    else:
        _print(console, diagnosis)
    if check and diagnosis.fired:
        raise typer.Exit(code=1)


def _diagnose_path(run: Path, thresholds) -> Diagnosis:
    timeline = timeline_path(run)
    return diagnose_timeline(timeline, thresholds) if timeline is not None else diagnose_run(run, thresholds)


def _print(console: Console, diagnosis: Diagnosis) -> None:
    for note in diagnosis.notes:
        console.print(f"[dim]note: {escape(note)}[/dim]")
    for m in diagnosis.measurements:
        tag = "[magenta]estimate[/magenta]" if m.estimate else "[dim]measured[/dim]"
        console.print(f"{tag} {escape(m.source)}: {escape(m.text)}", soft_wrap=True)
    for skipped in diagnosis.not_evaluated:
        console.print(
            f"[dim]not evaluated[/dim] {skipped.rule} [bold]{escape(skipped.source)}[/bold]: {escape(skipped.reason)}",
            soft_wrap=True,
        )
    if not diagnosis.findings:
        console.print(
            f"[green]no findings[/green] in {diagnosis.checked} point(s)/series of {escape(diagnosis.source)}"
        )
        return
    if not diagnosis.fired:
        console.print(
            f"[green]no warnings[/green] in {diagnosis.checked} point(s)/series of {escape(diagnosis.source)}"
        )
    console.print(
        f"[bold]kvbench diagnose[/bold]: {len(diagnosis.findings)} finding(s) in {diagnosis.checked} "
        f"point(s)/series of {escape(diagnosis.source)}"
    )
    for group in grouped(diagnosis.findings):
        style = _STYLE.get(group.severity, "default")
        head = f"\n[{style}]{group.severity.upper()}[/] {group.rule}  "
        if len(group.cases) == 1:
            ((source, evidence),) = group.cases
            console.print(f"{head}[bold]{escape(source)}[/bold]")
            console.print(f"  evidence:   {escape(evidence)}", soft_wrap=True)
        else:
            console.print(f"{head}[bold]{len(group.cases)} points[/bold]")
            for source, evidence in group.cases:
                console.print(f"  [bold]{escape(source)}[/bold]: {escape(evidence)}", soft_wrap=True)
        console.print(f"  suggestion: {escape(group.suggestion)}", soft_wrap=True)
