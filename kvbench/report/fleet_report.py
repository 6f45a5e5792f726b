"""The fleet's table, summary files and plots: one row per routing policy, on the same arrivals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from kvbench.report.columns import markdown_table
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


def died(points: list[dict]) -> str | None:
    """Which instances died and under which policy: the policies after ran on fewer, not on equal terms."""
    found = [
        (p["policy"], instance)
        for p in points
        for instance in p.get("instances", [])
        if instance.get("failure") and instance.get("failure") != DEAD_BEFORE
    ]
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
            f"{units.count(base['preemptions'])} under {base['policy']}: requests went where KV blocks were free, "
            "so fewer ran out of them mid-answer."
        )
    if all(p.get("request_goodput") is not None for p in ok):
        top = max(ok, key=lambda p: p["request_goodput"])
        out.append(
            f"{top['policy']} met the SLO for {units.share(top.get('slo_met_share'), 0)} of requests "
            f"({top['request_goodput']:.2f} requests/s of goodput) against "
            f"{units.share(base.get('slo_met_share'), 0)} under {base['policy']}."
        )
    return out


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
                f"{_pct(row['hit_rate_real'])} / {_pct(row['hit_rate_simulated'])}",
                f"{row['preemptions_real']} / {row['preemptions_simulated']}",
                f"{_ms(row['p50_ttft_ms_real'])} / {_ms(row['p50_ttft_ms_simulated'])}",
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


_COLUMNS = (
    "policy",
    "done/rej",
    "out tok/s",
    "p50/p99 TTFT ms",
    "p50/p99 TPOT ms",
    "preempt",
    "KV use mean",
    "imbalance mean/p99 (blocks)",
    "queued peak",
    "inst-s",
    "prefix hit",
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def policy_rows(points: list[dict]) -> list[list[str]]:
    rows = []
    for p in points:
        rows.append(
            [
                p["policy"] + (" (ERROR)" if p["status"] == "error" else ""),
                f"{p['completed']}/{p['rejected']}" + (f" ({p['rerouted']} re-routed)" if p.get("rerouted") else ""),
                _num(p["output_throughput"], 1),
                f"{_ms(p['p50_ttft_ms'])} / {_ms(p['p99_ttft_ms'])}",
                f"{_ms(p['p50_tpot_ms'])} / {_ms(p['p99_tpot_ms'])}",
                str(p["preemptions"]),
                _pct(p["kv_usage_mean"]),
                f"{_num(p['free_blocks_imbalance_mean'])} / {_num(p['free_blocks_imbalance_p99'])}",
                _num(p["queued_peak"]),
                _num(p["instance_seconds"], 1),
                _pct(p["prefix_hit_rate"]),
            ]
        )
    return rows


def fleet_table(points: list[dict], simulated: bool) -> Table:
    table = Table(
        title="Routing policies on the same arrivals (latency: lower is better; imbalance = max - min free "
        "blocks across instances)" + (" — SIMULATED" if simulated else "")
    )
    longest = max((len(str(p.get("policy", ""))) for p in points), default=6)
    for column in _COLUMNS:  # a policy's name stays whole: "most-fr…" and "prefix-…" read alike
        if column == "policy":
            table.add_column(column, justify="left", no_wrap=True, min_width=longest)
        else:
            table.add_column(column, justify="right")
    for row in policy_rows(points):
        table.add_row(*row)
    return table


def instance_table(point: dict) -> Table:
    table = Table(title=f"Instances under {point['policy']}")
    for column in (
        "instance",
        "state",
        "routed",
        "finished",
        "preempt",
        "KV use mean/peak",
        "min free blocks",
        "prefix hit",
        "start-up s",
        "failure",
    ):
        table.add_column(column, justify="left" if column in ("state", "failure") else "right")
    for inst in point["instances"]:
        table.add_row(
            instance_label(inst),
            inst["state"],
            str(inst["routed"]),
            str(inst["finished"]),
            str(inst["preemptions"]),
            f"{_pct(inst['usage_mean'])} / {_pct(inst['usage_peak'])}",
            _num(inst["free_blocks_min"]),
            _pct(inst["prefix_hit_rate"]),
            _num(inst["startup_s"], 2),
            inst["failure"] or "",
        )
    return table


def instance_label(inst: dict) -> str:
    """An instance's number, and a server's name where it has one."""
    return f"{inst['index']} {inst['name']}" if inst.get("name") else str(inst["index"])


def write_outputs(run_dir: Path, meta: dict[str, Any], points: list[dict]) -> dict[str, Any]:
    """summary.json/csv/md and the plots; returns the summary document."""
    document = summary_document("fleet", meta, points)
    rows = [flatten({k: v for k, v in p.items() if k != "instances"}) for p in points]
    markdown = (
        f"# kvbench fleet{' (SIMULATED)' if meta.get('simulated') else ''}\n\n"
        f"{meta.get('instances')} instances of {meta.get('model_name')} ({meta.get('engines', ['?'])[0]} "
        f"engine), {meta.get('requests')} requests, arrivals: {meta.get('arrivals')}\n\n"
        + markdown_table(list(_COLUMNS), policy_rows(points))
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
