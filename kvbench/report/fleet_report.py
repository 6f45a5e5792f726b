"""The fleet's table, summary files and plots: one row per routing policy, on the same arrivals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from rich.table import Table

from kvbench import units
from kvbench.report.columns import Col, TableSpec, markdown_table
from kvbench.report.run_input import read_run_json
from kvbench.report.rundir import flatten, write_summary
from kvbench.results.fleet_meta import FleetAutoscale, FleetMeta
from kvbench.results.fleet_point import FleetInstance, FleetPoint
from kvbench.results.fleet_series import FleetSeries
from kvbench.results.fleet_summary import FleetSummary
from kvbench.results.simulator_check import TIMED_BY_COUNTERS, SimulatorCheck

R = TypeVar("R")  # a table's row: a policy's point or an instance

DEAD_BEFORE = "dead since an earlier policy"  # the failure of an instance lost under a policy before this one

TIE_SHARE = 0.10  # p99 TTFTs this close (of the worst) name no winner: one seed's arrivals decide less than that
LOAD_REACHED_SHARE = 0.5  # a run whose busiest policy kept less than this share of the usage aimed at is said short


def fleet_verdict(points: list[FleetPoint], meta: FleetMeta) -> tuple[str, str, list[str]]:
    """The fleet's verdict, written once for the console and report.html: (headline, tone, sentences)."""
    ok = [(p, p99) for p in points if p.ok and (p99 := p.p99_ttft_ms) is not None]
    failed = [p.policy for p in points if not p.ok]
    sentences = []
    if not ok:
        return "No routing policy completed", "bad", [f"failed: {', '.join(failed)}"] if failed else []
    best, best_p99 = min(ok, key=lambda pair: pair[1])
    worst, worst_p99 = max(ok, key=lambda pair: pair[1])
    if len(ok) == 1:
        headline = f"{best.policy}: p99 time to first token {units.ms(best_p99)}"
        tone = "neutral"
    elif worst_p99 - best_p99 <= TIE_SHARE * worst_p99:
        headline = (
            f"No routing policy stood out: p99 time to first token {units.ms(best_p99)} to "
            f"{units.ms(worst_p99)} across {len(ok)} policies, within {TIE_SHARE:.0%} on one seed's "
            "arrivals"
        )
        tone = "neutral"
    else:
        headline = (
            f"{best.policy} had the lowest p99 time to first token: {units.ms(best_p99)}, "
            f"against {units.ms(worst_p99)} for {worst.policy}"
        )
        tone = "good"
        sentences.append(
            f"Under {best.policy}: {units.count(best.preemptions)} preemptions, free blocks differed by "
            f"{units.count(best.free_blocks_imbalance_mean)} blocks between the emptiest and the fullest "
            f"instance on average, mean KV usage {units.share(best.kv_usage_mean, 0)}. Under "
            f"{worst.policy}: {units.count(worst.preemptions)} preemptions, imbalance "
            f"{units.count(worst.free_blocks_imbalance_mean)} blocks."
        )
    ok_points = [p for p, _ in ok]
    for p in ok_points:
        if p.rejected:
            sentences.append(
                f"{p.policy} rejected {units.count(p.rejected)} of {units.count(p.rejected + p.completed)} requests."
            )
    if failed:
        sentences.append(f"Failed: {', '.join(failed)}.")
        tone = "warn"
    sentences.extend(reuse_sentences(ok_points))
    if meta.simulator_check is not None:
        sentences.append(simulator_sentence(meta.simulator_check))
    for p in points:
        for note in p.notes:
            sentences.append(f"{p.policy}: {note}.")
            tone = "warn" if tone != "bad" else tone
    deaths = died(points)
    if deaths:
        sentences.insert(0, deaths)
        tone = "warn"
    shortfall = _load_shortfall(ok_points, meta)
    if shortfall:
        sentences.insert(0, shortfall)
        tone = "warn"
    sentences.append("Every policy served the same arrivals; one seed and one workload: run it on yours.")
    return headline, tone, sentences


def deaths(points: list[FleetPoint]) -> list[tuple[str, FleetInstance]]:
    """(policy, instance) of each instance that died under that policy (not those dead since an earlier one)."""
    return [
        (p.policy, instance)
        for p in points
        for instance in p.instances
        if instance.failure and instance.failure != DEAD_BEFORE
    ]


def died(points: list[FleetPoint]) -> str | None:
    """Which instances died and under which policy: the policies after ran on fewer, not on equal terms."""
    found = deaths(points)
    if not found:
        return None
    named = "; ".join(f"{i.name or 'instance ' + str(i.index)} under {policy} ({i.failure})" for policy, i in found)
    return (
        f"{len(found)} instance{'s' if len(found) > 1 else ''} died: {named}. The policies from then on ran on "
        "fewer instances: their figures are not comparable with the others'."
    )


def reuse_sentences(ok: list[FleetPoint]) -> list[str]:
    """Which policy kept the most prompt tokens cached, preempted least and (with an SLO) met it most often,
    each against round-robin (else the first policy), from the run's own figures."""
    if len(ok) < 2:
        return []
    base = next((p for p in ok if p.policy == "round-robin"), ok[0])
    out = []
    best = max(ok, key=lambda p: p.prefix_hit_rate or 0.0)
    gain = (best.prefix_hit_rate or 0.0) - (base.prefix_hit_rate or 0.0)
    if best is not base and gain >= 0.01:
        out.append(
            f"{best.policy} found {units.share(best.prefix_hit_rate, 0)} of prompt tokens in the prefix cache "
            f"against {units.share(base.prefix_hit_rate, 0)} under {base.policy} "
            f"(+{100 * gain:.0f} points): those tokens were not computed again; its median time to first token was "
            f"{units.ms(best.p50_ttft_ms)} against {units.ms(base.p50_ttft_ms)}."
        )
    fewest = min(ok, key=lambda p: p.preemptions)
    if fewest is not base and fewest.preemptions < base.preemptions:
        out.append(
            f"{fewest.policy} preempted {units.count(fewest.preemptions)} requests against "
            f"{units.count(base.preemptions)} under {base.policy}: {_split_sentence(fewest, base)}"
        )
    goodputs = [(p, p.request_goodput) for p in ok]
    if all(goodput is not None for _, goodput in goodputs):
        top, goodput = max(goodputs, key=lambda pair: pair[1] or 0.0)
        out.append(
            f"{top.policy} met the SLO for {units.share(top.slo_met_share, 0)} of requests "
            f"({goodput:.2f} requests/s of goodput) against "
            f"{units.share(base.slo_met_share, 0)} under {base.policy}."
        )
    return out


def _split_sentence(fewest: FleetPoint, base: FleetPoint) -> str:
    """How the two policies divided the requests, beside each instance's KV pool: the run's own reason why one
    preempted less (a policy that sends requests in proportion to the pools fills the smaller one less)."""
    instances = fewest.instances
    routed = [i.routed for i in instances]
    base_routed = [i.routed for i in base.instances]
    if len(routed) < 2 or len(base_routed) != len(routed) or not sum(routed) or not sum(base_routed):
        return "fewer requests ran out of KV blocks mid-answer."
    names = "/".join(str(i.name or i.index) for i in instances)
    text = (
        f"it sent {_shares_text(routed)} of the requests to {names}, where {base.policy} sent "
        f"{_shares_text(base_routed)}"
    )
    pools = [i.total_blocks for i in instances]
    if all(isinstance(n, int) for n in pools) and len(set(pools)) > 1:
        text += f"; their KV pools hold {'/'.join(units.count(n) for n in pools)} blocks"
    return text + "."


def _shares_text(counts: list[int]) -> str:
    return "/".join(f"{100 * n / sum(counts):.0f}" for n in counts) + "%"


SIM_COLUMNS = (
    "policy",
    "share per instance, real / simulated",
    "prefix hit, real / sim",
    "preempt, real / sim",
    "p50 TTFT ms, real / sim",
    "decode step ms + per request",
    "within 5 points",
)


def simulator_rows(check: SimulatorCheck) -> list[list[str]]:
    """The simulator against the real run, a row per policy (the console, summary.md and report.html)."""
    rows = []
    for row in check.policies:
        if row.skipped:
            rows.append([row.policy, f"not compared: {row.skipped}", *[""] * (len(SIM_COLUMNS) - 2)])
            continue
        shares = " ".join(
            f"{100 * a:.0f}/{100 * b:.0f}%" for a, b in zip(row.share_real, row.share_simulated, strict=True)
        )
        step = row.timing or check.timing
        rows.append(
            [
                row.policy,
                shares,
                f"{units.share(row.hit_rate_real, 0)} / {units.share(row.hit_rate_simulated, 0)}",
                f"{row.preemptions_real} / {row.preemptions_simulated}",
                f"{units.ms_number(row.p50_ttft_ms_real)} / {units.ms_number(row.p50_ttft_ms_simulated)}",
                f"{1000 * step.decode_s:.2f} + {1000 * step.decode_per_running_s:.2f}",
                "yes" if row.agrees else "no",
            ]
        )
    return rows


def simulator_sentence(check: SimulatorCheck) -> str:
    compared = check.compared
    fitted = _step_times_text(check)
    if not compared:
        return "The simulator was not compared with this run: a server died under every policy."
    off = [row for row in compared if not row.agrees]
    if not off:
        return (
            f"The simulator, given these servers' KV pools and {fitted}, matched every policy's share of requests "
            "per instance and its prefix hit rate within 5 points."
        )
    worst = max(off, key=lambda r: max(r.share_gap_points, abs(r.hit_rate_gap_points or 0.0)))
    hit = worst.hit_rate_gap_points
    return (
        f"The simulator, given these servers' KV pools and {fitted}, was more than 5 points off for "
        f"{len(off)} of {len(compared)} policies, most under {worst.policy} (share {worst.share_gap_points:.0f} "
        f"points, hit rate {'unknown' if hit is None else f'{hit:+.0f} points'}): trust its answers for this fleet "
        "less there."
    )


def _step_times_text(check: SimulatorCheck) -> str:
    """What the simulated steps took (a range over the policies where each had its own), and where from."""
    if check.timed_by == TIMED_BY_COUNTERS:
        source = "the step times each policy's servers counted in its run"
        steps = [row.timing or check.timing for row in check.compared] or [check.timing]
    else:
        source, steps = "step times fitted to this run's requests", [check.timing]

    def spread(values: list[float]) -> str:
        low, high = f"{min(values):.2f}", f"{max(values):.2f}"
        return low if low == high else f"{low}-{high}"

    return (
        f"{source} (decode {spread([1000 * t.decode_s for t in steps])} ms a step + "
        f"{spread([1000 * t.decode_per_running_s for t in steps])} ms per running request, prefill "
        f"{spread([1000 * t.prefill_base_s for t in steps])} ms a step + "
        f"{spread([1e6 * t.prefill_per_token_s for t in steps])} us a token)"
    )


def simulator_table(check: SimulatorCheck) -> Table:
    table = Table(title="The simulator against this run (same arrivals, the servers' KV pools, fitted step times)")
    for column in SIM_COLUMNS:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in simulator_rows(check):
        table.add_row(*row)
    return table


def _load_shortfall(ok: list[FleetPoint], meta: FleetMeta) -> str | None:
    """A run that aimed at a share of the KV blocks and stayed far below it: its policies barely differ."""
    aimed = meta.rate_chosen.usage if meta.rate_chosen is not None else None
    reached = max((p.kv_usage_mean for p in ok if p.kv_usage_mean is not None), default=None)
    if not aimed or reached is None or reached >= LOAD_REACHED_SHARE * aimed:
        return None
    return (
        f"The rate aimed at about {aimed:.0%} of the KV blocks in use; the busiest policy reached {reached:.0%} on "
        f"average ({aimed / max(reached, 1e-9):.1f}x short): too few requests to fill the fleet, so its policies "
        "differ little; send more requests per run."
    )


def _policy_name(p: FleetPoint) -> str:
    return p.policy + ("" if p.ok else f" ({p.status.upper()})")


def _rejected(p: FleetPoint) -> str:
    return units.count(p.rejected) + (f" ({p.rerouted} re-routed)" if p.rerouted else "")


def _column(
    heading: str,
    field: str,
    value: Callable[[R], Any],
    text: Callable[[Any], str],
    short: str = "",
    wide: bool = False,
    figure: bool = True,
    numeric: bool = True,
    key: bool = False,
) -> Col[R]:
    """A column showing one field's value (``value``) as ``text`` writes it, and ordered by it on the page."""
    return Col(
        heading,
        lambda row: text(value(row)),
        field=field,
        short=short,
        wide=wide,
        page=wide,
        figure=figure,
        numeric=numeric,
        key=key,
        sort=value,
    )


POLICY_TABLE: TableSpec[FleetPoint] = TableSpec(
    title="Routing policies on the same arrivals (latency: lower is better; imbalance = max - min free blocks "
    "across instances)",
    columns=(
        Col("policy", _policy_name, field="policy", figure=False, key=True, numeric=False, sort=lambda p: p.policy),
        _column("completed", "completed", lambda p: p.completed, units.count, short="done"),
        Col("rejected", _rejected, field="rejected", short="rej", sort=lambda p: p.rejected),
        _column("output (tok/s)", "output_throughput", lambda p: p.output_throughput, units.num, short="out tok/s"),
        _column("TTFT p50 (ms)", "p50_ttft_ms", lambda p: p.p50_ttft_ms, units.ms_number),
        _column("TTFT p99 (ms)", "p99_ttft_ms", lambda p: p.p99_ttft_ms, units.ms_number),
        _column("TPOT p50 (ms)", "p50_tpot_ms", lambda p: p.p50_tpot_ms, units.ms_number, wide=True),
        _column("TPOT p99 (ms)", "p99_tpot_ms", lambda p: p.p99_tpot_ms, units.ms_number),
        _column("preemptions", "preemptions", lambda p: p.preemptions, units.count, short="preempt"),
        _column(
            "KV usage mean (%)", "kv_usage_mean", lambda p: p.kv_usage_mean, units.share_number, short="KV use mean %"
        ),
        _column(
            "imbalance mean (blocks)", "free_blocks_imbalance_mean", lambda p: p.free_blocks_imbalance_mean, units.count
        ),
        _column(
            "imbalance p99 (blocks)",
            "free_blocks_imbalance_p99",
            lambda p: p.free_blocks_imbalance_p99,
            units.count,
            wide=True,
        ),
        _column("queued, peak", "queued_peak", lambda p: p.queued_peak, units.count, wide=True),
        _column(
            "instance-seconds", "instance_seconds", lambda p: p.instance_seconds, units.num, short="inst-s", wide=True
        ),
        _column(
            "prefix hits (%)", "prefix_hit_rate", lambda p: p.prefix_hit_rate, units.share_number, short="prefix hit %"
        ),
    ),
    partial_errors=True,  # a policy that failed part way keeps what it measured, in red
)
POLICY_TABLE_NOTE = (
    "Output: generated tokens per second, higher is better. Latency: lower is better. Imbalance: the most minus "
    "the fewest free KV blocks across the serving instances, sampled over the run. Prefix hits: the share of "
    "prompt tokens served from the prefix cache."
)


INSTANCE_TABLE: TableSpec[FleetInstance] = TableSpec(
    title="Instances",
    columns=(
        Col("instance", lambda i: i.label, field="index", figure=False, key=True, sort=lambda i: i.index),
        _column("state", "state", lambda i: i.state, str, figure=False, numeric=False),
        _column("KV pool (blocks)", "total_blocks", lambda i: i.total_blocks, units.count, short="KV pool blocks"),
        _column("routed", "routed", lambda i: i.routed, units.count),
        _column("finished", "finished", lambda i: i.finished, units.count),
        _column("preemptions", "preemptions", lambda i: i.preemptions, units.count, short="preempt"),
        _column("KV usage mean (%)", "usage_mean", lambda i: i.usage_mean, units.share_number, short="KV use mean %"),
        _column("KV usage peak (%)", "usage_peak", lambda i: i.usage_peak, units.share_number, short="KV use peak %"),
        _column(
            "free blocks, min", "free_blocks_min", lambda i: i.free_blocks_min, units.count, short="min free blocks"
        ),
        _column(
            "prefix hits (%)", "prefix_hit_rate", lambda i: i.prefix_hit_rate, units.share_number, short="prefix hit %"
        ),
        _column("start-up (s)", "startup_s", lambda i: i.startup_s, lambda v: units.num(v, 2), short="start-up s"),
        Col(
            "failure",
            lambda i: i.failure or "",
            field="failure",
            figure=False,
            numeric=False,
            sort=lambda i: i.failure,
        ),
    ),
    partial_errors=True,
)


def fleet_table(points: list[FleetPoint], simulated: bool) -> Table:
    spec = replace(POLICY_TABLE, title=POLICY_TABLE.title + (" — SIMULATED" if simulated else ""))
    return spec.rich(points)


def instance_table(point: FleetPoint) -> Table:
    return replace(INSTANCE_TABLE, title=f"Instances under {point.policy}").rich(point.instances)


def write_outputs(run_dir: Path, fleet: FleetMeta, points: list[FleetPoint]) -> dict[str, Any]:
    """summary.json/csv/md and the plots; returns the summary document."""
    document = FleetSummary(fleet, points).to_json()
    rows = [flatten(p.to_json(instances=False)) for p in points]
    markdown = (
        f"# kvbench fleet{' (SIMULATED)' if fleet.simulated else ''}\n\n"
        f"{fleet.instances} instances of {fleet.model_name} ({fleet.engine} "
        f"engine), {fleet.requests} requests, arrivals: {fleet.arrivals}\n\n" + POLICY_TABLE.markdown(points)
    )
    if fleet.simulator_check is not None:
        markdown += "\n\n## The simulator against this run\n\n" + markdown_table(
            list(SIM_COLUMNS), simulator_rows(fleet.simulator_check)
        )
    write_summary(run_dir, document, rows, markdown)
    read = [read_series(run_dir, p.policy) for p in points]
    series = [s for s in read if s is not None]
    if series:
        write_plots(run_dir, series, fleet.simulated, fleet.autoscale)
    return document


def read_series(run_dir: Path, policy: str) -> FleetSeries | None:
    """A policy's plot series (``fleet-<policy>.json``), None where the file is missing."""
    data = read_run_json(run_dir, f"fleet-{policy}.json")
    return None if data is None else FleetSeries.from_json(data)


def write_plots(
    run_dir: Path, series: list[FleetSeries], simulated: bool, autoscale: FleetAutoscale | None
) -> list[Path]:
    from kvbench.report import plots  # matplotlib loads only when a plot is drawn

    tag = " (SIMULATED)" if simulated else ""
    up = autoscale.scale_up if autoscale is not None and autoscale.scale_up is not None else 0.8
    paths = [
        plots.usage_panels(
            {
                s.policy: {s.label(i): ([t for t, _ in xs], [100 * u for _, u in xs]) for i, xs in s.usage.items()}
                for s in series
            },
            run_dir / "fleet_usage.png",
            f"KV block usage per instance over time, per policy{tag}",
            "time since the first arrival (s)",
            "blocks in use (% of the instance's pool)",
            100 * up,
            "lines close together: balanced, which is better; one line high while others idle: the router missed "
            "free memory",
        )
    ]
    paths.append(
        plots.lines(
            {s.policy: ([1000 * t for t, _ in s.ttft_cdf], [q for _, q in s.ttft_cdf]) for s in series if s.ttft_cdf},
            run_dir / "fleet_ttft_cdf.png",
            f"Time to first token, CDF per policy{tag}",
            "TTFT (ms, log scale)",
            "share of requests with TTFT at most x",
            "left / higher is better",
            markers=False,
            logx=True,
        )
    )
    counts = {n + m for s in series for _, n, m in s.instances}
    if len(counts) < 2:  # nothing scaled: a flat line at the fleet's size says nothing the table does not
        return paths
    paths.append(
        plots.lines(
            {s.policy: ([t for t, _, _ in s.instances], [n + m for _, n, m in s.instances]) for s in series},
            run_dir / "fleet_instances.png",
            f"Instances over time (serving + starting), per policy{tag}",
            "time since the first arrival (s)",
            "instances",
            "fewer for the same latency is cheaper",
            markers=False,
            steps=True,
        )
    )
    return paths
