"""The fleet's table, summary files and plots: one row per routing policy, on the same arrivals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.table import Table

from kvbench.report.columns import Col, PointMap, TableSpec, markdown_table
from kvbench.report.html import units
from kvbench.report.run_input import read_run_json
from kvbench.report.rundir import flatten, write_summary
from kvbench.results.run_meta import summary_document

DEAD_BEFORE = "dead since an earlier policy"  # the failure of an instance lost under a policy before this one

TIE_SHARE = 0.10  # p99 TTFTs this close (of the worst) name no winner: one seed's arrivals decide less than that
LOAD_REACHED_SHARE = 0.5  # a run whose busiest policy kept less than this share of the usage aimed at is said short


def fleet_verdict(points: list[dict], meta: dict) -> tuple[str, str, list[str]]:
    """The fleet's verdict, written once for the console and report.html: (headline, tone, sentences)."""
    ok = [p for p in points if p.get("status") == "ok" and p.get("p99_ttft_ms") is not None]
    failed = [p["policy"] for p in points if p.get("status") != "ok"]
    sentences = []
    if not ok:
        return "No routing policy completed", "bad", [f"failed: {', '.join(failed)}"] if failed else []
    best = min(ok, key=lambda p: p["p99_ttft_ms"])
    if len(ok) == 1:
        headline = f"{best['policy']}: p99 time to first token {units.ms(best['p99_ttft_ms'])}"
        tone = "neutral"
    elif (worst := max(ok, key=lambda p: p["p99_ttft_ms"]))["p99_ttft_ms"] - best["p99_ttft_ms"] <= TIE_SHARE * worst[
        "p99_ttft_ms"
    ]:
        headline = (
            f"No routing policy stood out: p99 time to first token {units.ms(best['p99_ttft_ms'])} to "
            f"{units.ms(worst['p99_ttft_ms'])} across {len(ok)} policies, within {TIE_SHARE:.0%} on one seed's "
            "arrivals"
        )
        tone = "neutral"
    else:
        headline = (
            f"{best['policy']} had the lowest p99 time to first token: {units.ms(best['p99_ttft_ms'])}, "
            f"against {units.ms(worst['p99_ttft_ms'])} for {worst['policy']}"
        )
        tone = "good"
        sentences.append(
            f"Under {best['policy']}: {units.count(best.get('preemptions'))} preemptions, free blocks differed by "
            f"{units.count(best.get('free_blocks_imbalance_mean'))} blocks between the emptiest and the fullest "
            f"instance on average, mean KV usage {units.share(best.get('kv_usage_mean'), 0)}. Under "
            f"{worst['policy']}: {units.count(worst.get('preemptions'))} preemptions, imbalance "
            f"{units.count(worst.get('free_blocks_imbalance_mean'))} blocks."
        )
    for p in ok:
        if p.get("rejected"):
            sentences.append(
                f"{p['policy']} rejected {units.count(p['rejected'])} of "
                f"{units.count(p['rejected'] + p['completed'])} requests."
            )
    if failed:
        sentences.append(f"Failed: {', '.join(failed)}.")
        tone = "warn"
    sentences.extend(reuse_sentences(ok))
    check = meta.get("simulator_check")
    if check:
        sentences.append(simulator_sentence(check))
    for p in points:
        for note in p.get("notes") or []:
            sentences.append(f"{p['policy']}: {note}.")
            tone = "warn" if tone != "bad" else tone
    deaths = died(points)
    if deaths:
        sentences.insert(0, deaths)
        tone = "warn"
    shortfall = _load_shortfall(ok, meta)
    if shortfall:
        sentences.insert(0, shortfall)
        tone = "warn"
    sentences.append("Every policy served the same arrivals; one seed and one workload: run it on yours.")
    return headline, tone, sentences


def deaths(points: list[dict]) -> list[tuple[str, dict]]:
    """(policy, instance) of each instance that died under that policy (not those dead since an earlier one)."""
    return [
        (p["policy"], instance)
        for p in points
        for instance in p.get("instances", [])
        if instance.get("failure") and instance.get("failure") != DEAD_BEFORE
    ]


def died(points: list[dict]) -> str | None:
    """Which instances died and under which policy: the policies after ran on fewer, not on equal terms."""
    found = deaths(points)
    if not found:
        return None
    named = "; ".join(
        f"{i.get('name') or 'instance ' + str(i['index'])} under {policy} ({i['failure']})" for policy, i in found
    )
    return (
        f"{len(found)} instance{'s' if len(found) > 1 else ''} died: {named}. The policies from then on ran on "
        "fewer instances: their figures are not comparable with the others'."
    )


def reuse_sentences(ok: list[dict]) -> list[str]:
    """Which policy kept the most prompt tokens cached, preempted least and (with an SLO) met it most often,
    each against round-robin (else the first policy), from the run's own figures."""
    if len(ok) < 2:
        return []
    base = next((p for p in ok if p["policy"] == "round-robin"), ok[0])
    out = []
    best = max(ok, key=lambda p: p.get("prefix_hit_rate") or 0.0)
    gain = (best.get("prefix_hit_rate") or 0.0) - (base.get("prefix_hit_rate") or 0.0)
    if best is not base and gain >= 0.01:
        out.append(
            f"{best['policy']} found {units.share(best['prefix_hit_rate'], 0)} of prompt tokens in the prefix cache "
            f"against {units.share(base['prefix_hit_rate'], 0)} under {base['policy']} "
            f"(+{100 * gain:.0f} points): those tokens were not computed again; its median time to first token was "
            f"{units.ms(best.get('p50_ttft_ms'))} against {units.ms(base.get('p50_ttft_ms'))}."
        )
    fewest = min(ok, key=lambda p: p.get("preemptions") or 0)
    if fewest is not base and (fewest.get("preemptions") or 0) < (base.get("preemptions") or 0):
        out.append(
            f"{fewest['policy']} preempted {units.count(fewest['preemptions'])} requests against "
            f"{units.count(base['preemptions'])} under {base['policy']}: {_split_sentence(fewest, base)}"
        )
    if all(p.get("request_goodput") is not None for p in ok):
        top = max(ok, key=lambda p: p["request_goodput"])
        out.append(
            f"{top['policy']} met the SLO for {units.share(top.get('slo_met_share'), 0)} of requests "
            f"({top['request_goodput']:.2f} requests/s of goodput) against "
            f"{units.share(base.get('slo_met_share'), 0)} under {base['policy']}."
        )
    return out


def _split_sentence(fewest: dict, base: dict) -> str:
    """How the two policies divided the requests, beside each instance's KV pool: the run's own reason why one
    preempted less (a policy that sends requests in proportion to the pools fills the smaller one less)."""
    instances = fewest.get("instances") or []
    routed = [i.get("routed") or 0 for i in instances]
    base_routed = [i.get("routed") or 0 for i in base.get("instances") or []]
    if len(routed) < 2 or len(base_routed) != len(routed) or not sum(routed) or not sum(base_routed):
        return "fewer requests ran out of KV blocks mid-answer."
    names = "/".join(str(i.get("name") or i.get("index")) for i in instances)
    text = (
        f"it sent {_shares_text(routed)} of the requests to {names}, where {base['policy']} sent "
        f"{_shares_text(base_routed)}"
    )
    pools = [i.get("total_blocks") for i in instances]
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
    "within 5 points",
)


def simulator_rows(check: dict) -> list[list[str]]:
    """The simulator against the real run, a row per policy (the console, summary.md and report.html)."""
    rows = []
    for row in check.get("policies", []):
        if row.get("skipped"):
            rows.append([row["policy"], f"not compared: {row['skipped']}", "", "", "", ""])
            continue
        shares = " ".join(
            f"{100 * a:.0f}/{100 * b:.0f}%" for a, b in zip(row["share_real"], row["share_simulated"], strict=True)
        )
        rows.append(
            [
                row["policy"],
                shares,
                f"{units.share(row['hit_rate_real'], 0)} / {units.share(row['hit_rate_simulated'], 0)}",
                f"{row['preemptions_real']} / {row['preemptions_simulated']}",
                f"{units.ms_number(row['p50_ttft_ms_real'])} / {units.ms_number(row['p50_ttft_ms_simulated'])}",
                "yes" if row["agrees"] else "no",
            ]
        )
    return rows


def simulator_sentence(check: dict) -> str:
    compared = [row for row in check.get("policies", []) if not row.get("skipped")]
    timing = check.get("timing", {})
    fitted = (
        f"step times fitted to this run (decode {1000 * timing.get('decode_s', 0):.2f} ms a step, prefill "
        f"{1e6 * timing.get('prefill_per_token_s', 0):.1f} us a token)"
    )
    if not compared:
        return "The simulator was not compared with this run: a server died under every policy."
    off = [row for row in compared if not row["agrees"]]
    if not off:
        return (
            f"The simulator, given these servers' KV pools and {fitted}, matched every policy's share of requests "
            "per instance and its prefix hit rate within 5 points."
        )
    worst = max(off, key=lambda r: max(r["share_gap_points"], abs(r["hit_rate_gap_points"] or 0.0)))
    hit = worst["hit_rate_gap_points"]
    return (
        f"The simulator, given these servers' KV pools and {fitted}, was more than 5 points off for "
        f"{len(off)} of {len(compared)} policies, most under {worst['policy']} (share {worst['share_gap_points']:.0f} "
        f"points, hit rate {'unknown' if hit is None else f'{hit:+.0f} points'}): trust its answers for this fleet "
        "less there."
    )


def simulator_table(check: dict) -> Table:
    table = Table(title="The simulator against this run (same arrivals, the servers' KV pools, fitted step times)")
    for column in SIM_COLUMNS:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in simulator_rows(check):
        table.add_row(*row)
    return table


def _load_shortfall(ok: list[dict], meta: dict) -> str | None:
    """A run that aimed at a share of the KV blocks and stayed far below it: its policies barely differ."""
    aimed = (meta.get("rate_chosen") or {}).get("usage")
    reached = max((p["kv_usage_mean"] for p in ok if p.get("kv_usage_mean") is not None), default=None)
    if not aimed or reached is None or reached >= LOAD_REACHED_SHARE * aimed:
        return None
    return (
        f"The rate aimed at about {aimed:.0%} of the KV blocks in use; the busiest policy reached {reached:.0%} on "
        f"average ({aimed / max(reached, 1e-9):.1f}x short): too few requests to fill the fleet, so its policies "
        "differ little; send more requests per run."
    )


def _policy_name(p: PointMap) -> str:
    return str(p["policy"]) + ("" if p.get("status", "ok") == "ok" else f" ({str(p.get('status')).upper()})")


def _rejected(p: PointMap) -> str:
    return units.count(p.get("rejected")) + (f" ({p['rerouted']} re-routed)" if p.get("rerouted") else "")


def _percent(field: str) -> Callable[[PointMap], str]:
    """A share in [0, 1] as a number under a heading that says %."""
    return lambda p: units.MISSING if p.get(field) is None else units.num(100 * p[field])


def _figure(heading: str, field: str, text: Callable[[Any], str], short: str = "", wide: bool = False) -> Col:
    return Col(heading, lambda p: text(p.get(field)), field=field, short=short, wide=wide, page=wide)


POLICY_TABLE = TableSpec(
    title="Routing policies on the same arrivals (latency: lower is better; imbalance = max - min free blocks "
    "across instances)",
    columns=(
        Col("policy", _policy_name, field="policy", figure=False, key=True, numeric=False),
        _figure("completed", "completed", units.count, short="done"),
        Col("rejected", _rejected, field="rejected", short="rej"),
        _figure("output (tok/s)", "output_throughput", units.num, short="out tok/s"),
        _figure("TTFT p50 (ms)", "p50_ttft_ms", units.ms_number),
        _figure("TTFT p99 (ms)", "p99_ttft_ms", units.ms_number),
        _figure("TPOT p50 (ms)", "p50_tpot_ms", units.ms_number, wide=True),
        _figure("TPOT p99 (ms)", "p99_tpot_ms", units.ms_number),
        _figure("preemptions", "preemptions", units.count, short="preempt"),
        Col("KV usage mean (%)", _percent("kv_usage_mean"), field="kv_usage_mean", short="KV use mean %"),
        _figure("imbalance mean (blocks)", "free_blocks_imbalance_mean", units.count),
        _figure("imbalance p99 (blocks)", "free_blocks_imbalance_p99", units.count, wide=True),
        _figure("queued, peak", "queued_peak", units.count, wide=True),
        _figure("instance-seconds", "instance_seconds", units.num, short="inst-s", wide=True),
        Col("prefix hits (%)", _percent("prefix_hit_rate"), field="prefix_hit_rate", short="prefix hit %"),
    ),
    partial_errors=True,  # a policy that failed part way keeps what it measured, in red
)
POLICY_TABLE_NOTE = (
    "Output: generated tokens per second, higher is better. Latency: lower is better. Imbalance: the most minus "
    "the fewest free KV blocks across the serving instances, sampled over the run. Prefix hits: the share of "
    "prompt tokens served from the prefix cache."
)


def instance_label(inst: PointMap) -> str:
    """An instance's number, and a server's name where it has one."""
    return f"{inst['index']} {inst['name']}" if inst.get("name") else str(inst["index"])


def _startup(inst: PointMap) -> str:
    return units.num(inst.get("startup_s"), 2)


INSTANCE_TABLE = TableSpec(
    title="Instances",
    columns=(
        Col("instance", instance_label, field="index", figure=False, key=True),
        Col("state", lambda i: str(i.get("state", "")), field="state", figure=False, numeric=False),
        _figure("KV pool (blocks)", "total_blocks", units.count, short="KV pool blocks"),
        _figure("routed", "routed", units.count),
        _figure("finished", "finished", units.count),
        _figure("preemptions", "preemptions", units.count, short="preempt"),
        Col("KV usage mean (%)", _percent("usage_mean"), field="usage_mean", short="KV use mean %"),
        Col("KV usage peak (%)", _percent("usage_peak"), field="usage_peak", short="KV use peak %"),
        _figure("free blocks, min", "free_blocks_min", units.count, short="min free blocks"),
        Col("prefix hits (%)", _percent("prefix_hit_rate"), field="prefix_hit_rate", short="prefix hit %"),
        Col("start-up (s)", _startup, field="startup_s", short="start-up s"),
        Col("failure", lambda i: str(i.get("failure") or ""), field="failure", figure=False, numeric=False),
    ),
    partial_errors=True,
)


def fleet_table(points: list[dict], simulated: bool) -> Table:
    spec = replace(POLICY_TABLE, title=POLICY_TABLE.title + (" — SIMULATED" if simulated else ""))
    return spec.rich(points)


def instance_table(point: dict) -> Table:
    return replace(INSTANCE_TABLE, title=f"Instances under {point['policy']}").rich(point["instances"])


def write_outputs(run_dir: Path, meta: dict[str, Any], points: list[dict]) -> dict[str, Any]:
    """summary.json/csv/md and the plots; returns the summary document."""
    document = summary_document("fleet", meta, points)
    rows = [flatten({k: v for k, v in p.items() if k != "instances"}) for p in points]
    markdown = (
        f"# kvbench fleet{' (SIMULATED)' if meta.get('simulated') else ''}\n\n"
        f"{meta.get('instances')} instances of {meta.get('model_name')} ({meta.get('engines', ['?'])[0]} "
        f"engine), {meta.get('requests')} requests, arrivals: {meta.get('arrivals')}\n\n"
        + POLICY_TABLE.markdown(points)
    )
    if meta.get("simulator_check"):
        markdown += "\n\n## The simulator against this run\n\n" + markdown_table(
            list(SIM_COLUMNS), simulator_rows(meta["simulator_check"])
        )
    write_summary(run_dir, document, rows, markdown)
    read = [_read_series(run_dir, p["policy"]) for p in points]
    series = [s for s in read if s is not None]
    if series:
        write_plots(run_dir, series, bool(meta.get("simulated")), meta.get("autoscale"))
    return document


def _read_series(run_dir: Path, policy: str) -> dict | None:
    return read_run_json(run_dir, f"fleet-{policy}.json")


def _series_label(series: dict, index: str) -> str:
    name = (series.get("names") or {}).get(index)
    return f"instance {index} ({name})" if name else f"instance {index}"


def write_plots(run_dir: Path, series: list[dict], simulated: bool, autoscale: dict | None) -> list[Path]:
    from kvbench.report import plots  # matplotlib loads only when a plot is drawn

    tag = " (SIMULATED)" if simulated else ""
    up = (autoscale or {}).get("scale_up", 0.8)
    paths = [
        plots.usage_panels(
            {
                s["policy"]: {
                    _series_label(s, i): ([t for t, _ in xs], [100 * u for _, u in xs]) for i, xs in s["usage"].items()
                }
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
            {
                s["policy"]: ([1000 * t for t, _ in s["ttft_cdf"]], [q for _, q in s["ttft_cdf"]])
                for s in series
                if s["ttft_cdf"]
            },
            run_dir / "fleet_ttft_cdf.png",
            f"Time to first token, CDF per policy{tag}",
            "TTFT (ms, log scale)",
            "share of requests with TTFT at most x",
            "left / higher is better",
            markers=False,
            logx=True,
        )
    )
    counts = {n + m for s in series for _, n, m in s["instances"]}
    if len(counts) < 2:  # nothing scaled: a flat line at the fleet's size says nothing the table does not
        return paths
    paths.append(
        plots.lines(
            {s["policy"]: ([t for t, _, _ in s["instances"]], [n + m for _, n, m in s["instances"]]) for s in series},
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
