"""The fleet run's report: the policy with the lowest p99 TTFT named, every policy's row equal to summary.json,
the fleet plots from the series files, and each policy's instances."""

from __future__ import annotations

import json

from report_page import by_id, parse, table_rows

from kvbench.report.html import REPORT_FILE


def test_the_headline_names_the_best_policy_from_summary_json(fleet_run):
    summary = json.loads((fleet_run / "summary.json").read_text())
    page = parse((fleet_run / REPORT_FILE).read_text())
    points = summary["points"]
    best = min(points, key=lambda p: p["p99_ttft_ms"])
    worst = max(points, key=lambda p: p["p99_ttft_ms"])

    def ms(v):
        return f"{v:,.0f} ms" if v >= 100 else f"{v:,.1f} ms"

    if worst["p99_ttft_ms"] - best["p99_ttft_ms"] <= 0.10 * worst["p99_ttft_ms"]:  # within one seed's noise
        assert by_id(page, "verdict-headline").text().startswith("No routing policy stood out")
    else:
        assert by_id(page, "verdict-headline").text() == (
            f"{best['policy']} had the lowest p99 time to first token: {ms(best['p99_ttft_ms'])}, against "
            f"{ms(worst['p99_ttft_ms'])} for {worst['policy']}"
        )
    rows = table_rows(page, "headline-table")
    assert [r["policy"] for r in rows] == [p["policy"] for p in points]
    for row, point in zip(rows, points, strict=True):
        assert row["completed"] == f"{point['completed']:,}"
        assert row["output_throughput"] == f"{point['output_throughput']:,.1f}"
        assert row["preemptions"] == f"{point['preemptions']:,}"
        assert row["free_blocks_imbalance_mean"] == f"{point['free_blocks_imbalance_mean']:,.0f}"
    assert [f.attrs["data-plot"] for f in page.find_all("figure")] == [
        "fleet_usage.png",
        "fleet_ttft_cdf.png",
    ]  # a fixed fleet: no flat instances-over-time line
    for point in points:
        instances = by_id(page, f"instances-{point['policy']}").find("tbody").find_all("tr")
        assert len(instances) == len(point["instances"]) == 2


def test_a_missing_series_file_leaves_its_policy_out_of_the_plots(fleet_run, copy_run):
    from kvbench.report.html import render_run

    run = copy_run(fleet_run)
    (run / "fleet-round-robin.json").unlink()
    page = parse(render_run(run))
    usage = page.find("figure", data_plot="fleet_usage.png")
    assert "most-free-blocks" in usage.text() and "round-robin" not in usage.find("figcaption").text()


def _policy(name, p99, usage=0.8):
    return {"policy": name, "status": "ok", "p99_ttft_ms": p99, "kv_usage_mean": usage, "completed": 10, "rejected": 0}


def _verdict(points, meta):
    """The verdict of points and metadata as summary.json holds them."""
    from kvbench.report.fleet_report import fleet_verdict
    from kvbench.results.fleet_meta import FleetMeta
    from kvbench.results.fleet_point import FleetPoint

    return fleet_verdict([FleetPoint.from_json(p) for p in points], FleetMeta.from_json(meta))


def _reuse(points):
    from kvbench.report.fleet_report import reuse_sentences
    from kvbench.results.fleet_point import FleetPoint

    return reuse_sentences([FleetPoint.from_json(p) for p in points])


def test_a_winner_is_named_only_outside_the_runs_noise_and_a_load_never_reached_is_said():
    """61.5 ms against 63.4 ms on one seed's arrivals names no winner; a run that aimed at 85% of the KV blocks
    and kept 13% in use says so, and by how much."""
    headline, tone, _ = _verdict([_policy("round-robin", 61.5), _policy("random", 63.4)], {})
    assert headline.startswith("No routing policy stood out: p99 time to first token 61.5 ms to 63.4 ms")
    assert tone == "neutral"
    headline, _, _ = _verdict([_policy("round-robin", 61.5), _policy("random", 119.0)], {})
    assert headline.startswith("round-robin had the lowest p99 time to first token")
    meta = {"rate_chosen": {"usage": 0.85, "running_per_instance": 40}}
    _, tone, sentences = _verdict([_policy("a", 61.5, 0.13), _policy("b", 119.0, 0.12)], meta)
    assert tone == "warn" and sentences[0].startswith(
        "The rate aimed at about 85% of the KV blocks in use; the busiest policy reached 13% on average (6.5x short)"
    )
    _, _, sentences = _verdict([_policy("a", 61.5, 0.80), _policy("b", 119.0, 0.75)], meta)
    assert not any("aimed" in s for s in sentences)


def test_fewer_preemptions_are_explained_by_how_each_policy_split_the_requests_beside_the_pools():
    """The reason comes from the run: most-free-blocks sent a third to the server with half the pool, where
    round-robin sent half; with equal pools no pool sizes are quoted, and without instances no split is claimed."""

    def point(name, preemptions, routed, pools=(128, 256)):
        instances = [{"name": n, "routed": r, "total_blocks": b} for n, r, b in zip("ab", routed, pools, strict=True)]
        return {**_policy(name, 100.0), "preemptions": preemptions, "instances": instances}

    sentences = _reuse([point("round-robin", 45, [150, 150]), point("most-free-blocks", 12, [100, 200])])
    assert sentences == [
        "most-free-blocks preempted 12 requests against 45 under round-robin: it sent 33/67% of the requests to a/b, "
        "where round-robin sent 50/50%; their KV pools hold 128/256 blocks."
    ]
    equal = [point("round-robin", 45, [150, 150], (96, 96)), point("most-free-blocks", 30, [140, 160], (96, 96))]
    assert _reuse(equal)[0].endswith("it sent 47/53% of the requests to a/b, where round-robin sent 50/50%.")
    bare = [{**_policy("round-robin", 1.0), "preemptions": 4}, {**_policy("least-requests", 1.0), "preemptions": 1}]
    assert _reuse(bare)[0].endswith("under round-robin: fewer requests ran out of KV blocks mid-answer.")
