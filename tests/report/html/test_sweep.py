"""The sweep's report: the verdict in words from the article-shaped rows, the headline table equal to
summary.json, the sections in the reader's order, the plots and waterfalls inline, a reference engine's column."""

from __future__ import annotations

import csv
import io
import json

from report_page import by_id, headings, parse, section_ids, table_headers, table_rows

from kvbench.cli import main
from kvbench.report.html import REPORT_FILE, render_run
from kvbench.report.sweep_verdict import sweep_verdict
from kvbench.results.article import ArticleRow
from kvbench.results.point import Point
from kvbench.results.run_meta import RunMeta


def _row(c, cont_tps, paged_tps, cont_status="ok", paged_status="ok", reduction=60.0, **extra):
    gain = None if cont_status != "ok" or paged_status != "ok" else 100 * (paged_tps / cont_tps - 1)
    return ArticleRow.from_json(
        {
            "concurrency": c,
            "contiguous_tps": cont_tps,
            "contiguous_status": cont_status,
            "paged_tps": paged_tps,
            "paged_status": paged_status,
            "gain_pct": gain,
            "kv_memory_reduction_pct": reduction if gain is not None else None,
            **extra,
        }
    )


def _point(engine, c, status="ok", completed=60, rejected=0, peak=None, reservation=0.0, internal=0.0, tps=100.0):
    return {
        "engine": engine,
        "concurrency": c,
        "status": status,
        "completed": completed,
        "rejected": rejected,
        "peak_running": peak if peak is not None else c,
        "output_throughput": tps,
        "kv_pool_bytes": 1 << 30,
        "kv_peak_allocated_bytes": (1 << 30) * (reservation + internal + 10) // 100,
        "waste": {
            "token_state_pct": 10.0,
            "reservation_pct": reservation,
            "internal_pct": internal,
            "external_pct": 0.0,
            "free_pct": 50.0,
        },
    }


def verdict(rows, points, meta):
    return sweep_verdict(rows, [Point.from_json(p) for p in points], RunMeta.from_json(meta))


META = {"simulated": True, "reserve": "max", "max_len": 2048, "block_size": 16}


def test_verdict_names_the_oom_the_memory_and_why():
    rows = [_row(10, 600.0, 600.0, reduction=62.7), _row(50, 854.7, 1173.8, cont_status="oom")]
    points = [
        _point("contiguous", 10, reservation=2.5, internal=20.8),
        _point("paged", 10),
        _point("contiguous", 50, "oom", completed=30, rejected=30, peak=30, reservation=3.0, internal=38.9),
        _point("paged", 50, internal=0.3, tps=1173.8),
    ]
    v = verdict(rows, points, META)
    assert v.tone == "good"
    assert v.headline == (
        "Paging held the load the contiguous baseline could not: at C=50 contiguous ran out of KV "
        "memory, paged served all 60 requests"
    )
    text = " ".join(v.sentences)
    assert "paged needed 63% less than contiguous where both completed (C=10)" in text
    assert "At C=50 the contiguous baseline ran out of KV memory. Reserving max-len (2,048 tokens) per request" in text
    assert "it held 30 requests at once" in text and "rejected 30 of 60. Paging held all 50" in text
    assert "At equal batch (C=10)" in text and "equal by construction" in text
    assert "reserves max-len (2,048 token slots) for every request" in text
    assert "held 41.9% of its KV pool on average" in text and "Paged held 0.3% that way" in text
    assert "at most 50 against 30" in text


def test_verdict_of_a_measured_single_run_warns_that_throughput_may_be_noise():
    rows = [_row(10, 100.0, 130.0, reduction=70.0)]
    points = [_point("contiguous", 10, reservation=5, internal=50), _point("paged", 10, tps=130.0)]
    v = verdict(rows, points, {**META, "simulated": False})
    assert v.headline == "Paging served the same requests with 70% less KV memory at peak"
    text = " ".join(v.sentences)
    assert "Paged ran at 1.30x contiguous's speed" in text
    assert "not equal within ±10% in this single run; repeated points tell a real difference from noise" in text


def test_verdict_with_confidence_intervals_calls_an_overlap_on_par():
    rows = [_row(10, 100.0, 104.0, contiguous_tps_ci95=5.0, paged_tps_ci95=5.0)]
    points = [_point("contiguous", 10), _point("paged", 10, tps=104.0)]
    for point in points:
        point["output_throughput_ci95"] = 5.0
    v = verdict(rows, points, {**META, "simulated": False})
    assert "That is equal: the 95% confidence intervals overlap." in " ".join(v.sentences)


def test_verdict_flags_a_paged_oom_and_a_one_engine_sweep():
    v = verdict(
        [_row(10, 100.0, 0.0, paged_status="oom")],
        [_point("contiguous", 10), _point("paged", 10, "oom")],
        META,
    )
    assert v.tone == "bad" and "paged engine ran out of KV memory at C=10" in v.headline
    rows = [
        ArticleRow.from_json(
            {
                "concurrency": 4,
                "contiguous_tps": None,
                "contiguous_status": None,
                "paged_tps": 50.0,
                "paged_status": "ok",
                "gain_pct": None,
                "kv_memory_reduction_pct": None,
            }
        )
    ]
    v = verdict(rows, [_point("paged", 4, tps=50.0)], META)
    assert v.tone == "neutral" and "no paged/contiguous pair" in v.headline
    assert v.sentences == ["paged at C=4: 50.0 tok/s."]


def _expected_tps(row, engine):
    status = row.get(f"{engine}_status")
    if status != "ok":
        return status.upper()
    return f"{row[f'{engine}_tps']:,.1f}"


def test_the_page_of_a_sweep_holds_what_a_reader_asks_in_order(sweep_run):
    page = parse((sweep_run / REPORT_FILE).read_text())
    assert section_ids(page) == ["headline", "findings", "plots", "points", "waterfall", "provenance"]
    levels = headings(page)
    assert levels[0][0] == 1 and [lv for lv, _ in levels].count(1) == 1  # one h1, then h2 sections
    assert all(b - a <= 1 for (a, _), (b, _) in zip(levels, levels[1:], strict=False))  # no skipped level
    summary = json.loads((sweep_run / "summary.json").read_text())
    rows = table_rows(page, "headline-table")
    assert [int(r["concurrency"]) for r in rows] == [r["concurrency"] for r in summary["article_table"]]
    for shown, row in zip(rows, summary["article_table"], strict=True):
        assert shown["contiguous_tps"] == _expected_tps(row, "contiguous")
        assert shown["paged_tps"] == _expected_tps(row, "paged")
        gain = row["gain_pct"]
        assert shown["gain_pct"] == ("0%" if round(gain) == 0 else f"{gain:+.0f}%")
        assert shown["kv_memory_reduction_pct"] == f"{row['kv_memory_reduction_pct']:.0f}%"
    points = table_rows(page, "points-table")
    assert len(points) == len(summary["points"])
    for shown, point in zip(points, summary["points"], strict=True):
        assert shown["engine"] == point["engine"] and int(shown["concurrency"]) == point["concurrency"]
        assert shown["output_throughput"] == f"{point['output_throughput']:,.0f}"  # as the console and summary.md
        assert shown["completed"] == f"{point['completed']}/{point['rejected']}"
    plots = [f.attrs["data-plot"] for f in page.find_all("figure")]
    assert {"throughput.png", "latency.png", "memory.png", "blocks_over_time.png"} <= set(plots)
    assert sorted(p for p in plots if p.startswith("waterfall-")) == sorted(
        f"waterfall-{p['engine']}-c{p['concurrency']}.png" for p in summary["points"]
    )
    for figure in page.find_all("figure"):  # every plot inline, named by its caption
        svg = figure.find("svg")
        assert svg is not None and svg.attrs["role"] == "img"
        assert by_id(page, svg.attrs["aria-labelledby"]).text()
    headline = by_id(page, "verdict-headline").text()
    assert headline.startswith("Paging") or headline.startswith("The paged engine")


def test_provenance_says_how_the_run_was_made(sweep_run):
    page = parse((sweep_run / REPORT_FILE).read_text())
    facts = {dt.text(): dd.text() for dt, dd in zip(page.find_all("dt"), page.find_all("dd"), strict=True)}
    meta = json.loads((sweep_run / "summary.json").read_text())["meta"]
    assert facts["command line"] == meta["command"]
    assert facts["date (UTC)"] == meta["created_utc"]
    assert facts["kvbench version"] == meta["kvbench_version"]
    assert facts["git commit"] == (meta["git_revision"] or "not recorded (not a git checkout)")
    assert facts["model"] == "tiny"
    assert facts["model shape"].startswith("llama, 2 layers, hidden 64, 4 heads (2 KV heads) × 16")
    assert facts["model shape"].endswith("fp32: 512 B of KV per token")
    assert facts["device"] == "cpu"
    assert facts["CPU threads"].startswith("1 (")
    assert f"torch {meta['torch_version']}" in facts["packages"] and "jinja2 " in facts["packages"]
    assert facts["host"].startswith(meta["host"]["cpu"] or "")
    assert "summary.json" in facts["built from"] and "timeline-paged-c4.json" in facts["built from"]


def test_a_reference_engine_gets_its_column_and_its_caveat(sweep_run, copy_run):
    run = copy_run(sweep_run)
    summary = json.loads((run / "summary.json").read_text())
    for c in (2, 4):
        paged = next(p for p in summary["points"] if p["engine"] == "paged" and p["concurrency"] == c)
        summary["points"].append({**paged, "engine": "vllm", "output_throughput": 999.5 + c})
    del summary["article_table"]  # rebuilt from the points
    (run / "summary.json").write_text(json.dumps(summary))
    page = parse(render_run(run))
    assert table_headers(page, "headline-table")[-1] == "vLLM TPS (reference)"
    assert [r["vllm_tps"] for r in table_rows(page, "headline-table")] == ["1,001.5", "1,003.5"]
    assert "vLLM (reference): 1,001.5 tok/s at C=2, 1,003.5 tok/s at C=4" in by_id(page, "verdict").text()
    engines = [r["engine"] for r in table_rows(page, "points-table")]
    assert engines.count("vllm (reference)") == 2


def test_the_oom_sweep_reads_as_the_article(oom_sweep_run):
    page = parse((oom_sweep_run / REPORT_FILE).read_text())
    assert "SIMULATED" in [b.text() for b in page.find_all("span")]
    assert by_id(page, "verdict-headline").text() == (
        "Paging held the load the contiguous baseline could not: at C=50 "
        "contiguous ran out of KV memory, paged served all 60 requests"
    )
    row = table_rows(page, "headline-table")[-1]
    assert row["contiguous_tps"] == "OOM" and row["gain_pct"] == "-"
    finding = page.find("li", **{"class": "finding severity-critical"})
    assert finding is not None and "contiguous C=50" in finding.text()


def test_kvbench_report_rebuilds_the_same_page(tmp_path, sweep_run, capsys):
    rebuilt = tmp_path / "again.html"
    assert main(["report", str(sweep_run), "--out", str(rebuilt)]) == 0
    assert rebuilt.read_bytes() == (sweep_run / REPORT_FILE).read_bytes()
    assert f"wrote {rebuilt}" in capsys.readouterr().out


def test_the_headline_title_speaks_of_plus_minus_only_over_repeats():
    from kvbench.report.html.sweep_page import headline_table

    single = [
        {
            "concurrency": 10,
            "contiguous_tps": 100.0,
            "paged_tps": 101.0,
            "contiguous_status": "ok",
            "paged_status": "ok",
        }
    ]
    repeated = [{**single[0], "contiguous_tps_ci95": 3.0, "paged_tps_ci95": 2.5}]
    assert "±" not in headline_table([ArticleRow.from_json(single[0])]).caption
    assert "± is the 95% CI over repeats" in headline_table([ArticleRow.from_json(repeated[0])]).caption


def test_a_point_that_ran_out_of_kv_memory_shows_no_figure_in_any_output(oom_sweep_run):
    """One rule for failed points: the page, summary.md and summary.json's reader all mark the OOM point, and
    none of them prints its throughput or latency, which describe a lighter load than the one asked for."""
    summary = json.loads((oom_sweep_run / "summary.json").read_text())
    oom = next(p for p in summary["points"] if p["status"] == "oom")
    figures = [
        f"{oom['output_throughput']:,.0f}",
        f"{oom['output_throughput']:,.1f}",
        *(f"{oom[f'p99_{kind}_ms']:.1f}" for kind in ("ttft", "tpot") if oom.get(f"p99_{kind}_ms")),
    ]
    page = parse((oom_sweep_run / REPORT_FILE).read_text())
    row = next(
        r
        for r in table_rows(page, "points-table")
        if r["engine"] == oom["engine"] and int(r["concurrency"]) == oom["concurrency"]
    )
    assert row["output_throughput"] == "OOM"
    assert {row[f] for f in ("steady_output_throughput", "p99_ttft_ms", "p99_tpot_ms", "p99_e2el_ms")} == {"-"}
    assert row["completed"] == f"{oom['completed']}/{oom['rejected']}"  # what it held is shown
    markdown_row = next(
        line
        for line in (oom_sweep_run / "summary.md").read_text().splitlines()
        if line.startswith(f"| {oom['engine']} | {oom['concurrency']} |")
    )
    assert "| OOM |" in markdown_row
    for figure in figures:
        assert figure not in " ".join(row.values()) and f"| {figure} |" not in markdown_row
    csv_rows = list(csv.DictReader(io.StringIO((oom_sweep_run / "summary.csv").read_text())))
    csv_row = next(r for r in csv_rows if r["engine"] == oom["engine"] and int(r["concurrency"]) == oom["concurrency"])
    assert csv_row["status"] == "oom" and int(csv_row["completed"]) == oom["completed"]
    for name in ("output_throughput", "steady_output_throughput", "p99_ttft_ms", "p99_tpot_ms", "duration"):
        assert csv_row.get(name, "") == "", name  # blank in the spreadsheet too
    assert any(r["status"] == "ok" and r["output_throughput"] for r in csv_rows)  # an ok point keeps its figures


def test_a_gain_is_coloured_only_where_the_verdict_calls_it_a_difference():
    """A single measured run's -5% is noise to the text beside the table: it is not drawn red."""
    from kvbench.report.html.sweep_page import headline_table

    row = {"concurrency": 10, "contiguous_tps": 100.0, "paged_tps": 95.0, "gain_pct": -5.0}
    row.update(contiguous_status="ok", paged_status="ok", kv_memory_reduction_pct=60.0)

    def tone(meta, **extra):
        cells = headline_table([ArticleRow.from_json({**row, **extra})], RunMeta.from_json(meta)).rows[0]
        return next(c.tone for c in cells if c.field == "gain_pct")

    assert tone({}) == ""  # one measured run: cannot tell
    assert tone({"simulated": True}) == "bad"  # exact
    assert tone({}, paged_tps_ci95=1.0, contiguous_tps_ci95=1.0) == "bad"  # beyond the confidence intervals
    assert tone({}, paged_tps_ci95=4.0, contiguous_tps_ci95=4.0) == ""  # within them


def test_the_cpu_matmul_timings_are_a_table_not_a_paragraph(sweep_run):
    meta = json.loads((sweep_run / "summary.json").read_text())["meta"]
    page = parse((sweep_run / REPORT_FILE).read_text())
    facts = [dt.text() for dt in page.find_all("dt")]
    assert "cpu matmuls" not in facts
    if meta.get("cpu_matmuls"):  # a CPU whose oneDNN packs: the measured paths, one row per weight
        rows = by_id(page, "cpu-matmuls").find("tbody").find_all("tr")
        assert len(rows) == len(meta["cpu_matmuls"]["weights"])
