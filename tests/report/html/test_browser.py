"""The report of every run kind (a short sweep, one with an OOM point, waste, fleet, share, dataset, reuse, a server
sweep) and of a compare, opened in headless Chromium: no console error, no request but the file itself, every plot
drawn and not blank, the headline equal to summary.json, tables that sort and fit 1,280 px, a phone-width window
without sideways scrolling whose plots keep a legible size (scrolling inside their box), plots that fit a printed
page. A screenshot of each page (and its PDF) is kept in the test's tmp dir; the paths are printed.

Skipped, saying why, where no Chromium is installed; CI installs Debian's chromium (.ci/run).
"""

from __future__ import annotations

import json

import pytest
from browser import Chromium, find_chromium
from run_kinds import RUN_KINDS

from kvbench.cli import main
from kvbench.report.html import REPORT_FILE

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium found (chromium, chromium-browser, google-chrome or KVBENCH_CHROMIUM): "
    "install Debian's chromium (apt-get install -y chromium) to open the reports in a browser",
)

CASES = [*RUN_KINDS, "compare_report"]
PHONE_WIDTH = 390
PHONE_PLOT_PX = 560  # a plot keeps at least this width on a phone (its 8 pt text stays about 6 px or more),
# scrolling sideways inside its own box
SCROLL_BOXES = """Array.from(document.querySelectorAll('figure .plot-scroll')).map(e => ({
  box: e.getBoundingClientRect().width, plot: e.querySelector('.plot').getBoundingClientRect().width}))"""
A4_CONTENT_PX = 718  # 210 mm - 2 x 12 mm margins, at 96 px per inch

PLOT_BOXES = """Array.from(document.querySelectorAll('figure .plot')).map(e => {
  const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
  return {name: e.closest('figure').dataset.plot, x: r.left + scrollX, y: r.top + scrollY, width: r.width,
          height: r.height, visible: s.display !== 'none' && s.visibility !== 'hidden'};
})"""


@pytest.fixture(scope="module")
def browser():
    with Chromium(CHROMIUM) as chromium:
        yield chromium


def _report(request, name):
    value = request.getfixturevalue(name)
    return value if value.suffix == ".html" else value / REPORT_FILE


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 100 else f"{value:,.1f} ms"


def _check_headline(request, name, page) -> None:
    """The headline the browser shows, against summary.json (or compare's own verdict)."""
    shown = page.evaluate("document.getElementById('verdict-headline').innerText").strip()
    if name == "compare_report":
        sweep, head = request.getfixturevalue("sweep_run"), request.getfixturevalue("regressed_head")
        judged = _compare_json(sweep, head)
        regressed = sum(r["verdict"] == "regressed" for r in judged["rows"])
        assert shown == f"FAIL: {regressed} regressed of {len(judged['rows'])} compared metrics"
        return
    run = request.getfixturevalue(name)
    summary = json.loads((run / "summary.json").read_text())
    if name == "sweep_run":
        cells = page.evaluate("""Array.from(document.querySelectorAll('#headline-table tbody tr')).map(
            tr => Object.fromEntries(Array.from(tr.cells).map(td => [td.dataset.field, td.innerText.trim()])))""")
        for row, expected in zip(cells, summary["article_table"], strict=True):
            assert int(row["concurrency"]) == expected["concurrency"]
            for engine in ("contiguous", "paged"):
                status = expected[f"{engine}_status"]
                assert row[f"{engine}_tps"] == (
                    f"{expected[f'{engine}_tps']:,.1f}" if status == "ok" else status.upper()
                )
        reductions = [
            r["kv_memory_reduction_pct"] for r in summary["article_table"] if r["kv_memory_reduction_pct"] is not None
        ]
        assert f"{min(reductions):.0f}%" in shown and f"{max(reductions):.0f}%" in shown
    elif name == "waste_run":
        points = summary["points"]
        best = max((p for p in points if p["engine"].startswith("paged")), key=lambda p: p["effective_usage_pct"])
        worst = next(p for p in points if p["engine"] == "contiguous-max")
        assert shown == (
            f"Effective KV memory usage: {best['engine']} {best['effective_usage_pct']:.1f}%, "
            f"contiguous-max {worst['effective_usage_pct']:.1f}%"
        )
    elif name == "fleet_run":
        points = summary["points"]
        best, worst = min(points, key=lambda p: p["p99_ttft_ms"]), max(points, key=lambda p: p["p99_ttft_ms"])
        if worst["p99_ttft_ms"] - best["p99_ttft_ms"] <= 0.10 * worst["p99_ttft_ms"]:  # no winner within the noise
            assert shown == (
                f"No routing policy stood out: p99 time to first token {_ms(best['p99_ttft_ms'])} to "
                f"{_ms(worst['p99_ttft_ms'])} across {len(points)} policies, within 10% on one seed's arrivals"
            )
        else:
            assert shown == (
                f"{best['policy']} had the lowest p99 time to first token: {_ms(best['p99_ttft_ms'])}, "
                f"against {_ms(worst['p99_ttft_ms'])} for {worst['policy']}"
            )


def _compare_json(base, head) -> dict:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        main(["compare", str(base), str(head), "--format", "json"])
    return json.loads(buffer.getvalue())


def _not_blank(path) -> tuple[float, int]:
    """Share of pixels that are not (near) white, and how many colours the image has."""
    from PIL import Image

    with Image.open(path) as image:
        rgb = image.convert("RGB")
    colours = rgb.getcolors(maxcolors=1 << 24) or []
    inked = sum(count for count, (r, g, b) in colours if r + g + b < 720)
    return inked / max(1, rgb.width * rgb.height), len(colours)


@pytest.mark.parametrize("name", CASES)
def test_the_report_opens_in_a_real_browser(request, browser, name, tmp_path):
    path = _report(request, name)
    page = browser.open(path, width=1280, height=900)
    page.settle(0.5)
    log = page.log()
    assert log.console == [], log.console
    assert [url for url in log.requests if not url.startswith("data:")] == [page.url], log.requests

    figures = path.read_text().count('<figure class="figure')
    boxes = page.evaluate(PLOT_BOXES)
    assert len(boxes) == figures > 0
    for index, box in enumerate(boxes):
        assert box["visible"] and box["width"] > 250 and box["height"] > 120, box
        shot = page.screenshot(
            tmp_path / f"plot-{index}.png",
            clip={"x": box["x"], "y": box["y"], "width": box["width"], "height": box["height"]},
        )
        inked, colours = _not_blank(shot)
        assert inked > 0.02 and colours > 8, (box["name"], inked, colours)

    _check_headline(request, name, page)

    sorted_ok = page.evaluate("""(() => {
      const table = document.querySelector('table.sortable');
      const button = table.querySelector('thead th button.sort');
      button.click(); const first = table.tHead.rows[0].cells[0].getAttribute('aria-sort');
      button.click(); const second = table.tHead.rows[0].cells[0].getAttribute('aria-sort');
      return [first, second];
    })()""")
    assert sorted_ok == ["ascending", "descending"]

    overflowing = page.evaluate("""Array.from(document.querySelectorAll('.table-wrap'))
      .filter(w => w.scrollWidth > w.clientWidth + 1)
      .map(w => [w.querySelector('table') && w.querySelector('table').id, w.scrollWidth, w.clientWidth])""")
    assert overflowing == [], overflowing  # every table fits a 1,280 px window without scrolling sideways

    screenshot = page.screenshot(tmp_path / f"{name}-1280.png")
    print(f"screenshot of the {name} report: {screenshot}")

    page.resize(PHONE_WIDTH, 800, mobile=True)
    page.settle(0.3)
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1] == PHONE_WIDTH, width  # tables scroll inside their box, the page never sideways
    boxes = page.evaluate(SCROLL_BOXES)
    assert boxes and all(b["box"] <= PHONE_WIDTH and b["plot"] >= PHONE_PLOT_PX for b in boxes), boxes
    print(f"phone-width screenshot: {page.screenshot(tmp_path / f'{name}-phone.png')}")

    page.media("print")
    page.resize(A4_CONTENT_PX, 1000)
    page.settle(0.3)
    printed = page.evaluate(PLOT_BOXES)
    assert len(printed) == figures
    assert all(b["visible"] and 0 < b["width"] <= A4_CONTENT_PX and b["height"] > 50 for b in printed), printed
    assert page.evaluate("getComputedStyle(document.querySelector('nav.toc')).display") == "none"
    pdf = page.pdf(tmp_path / f"{name}.pdf")
    assert pdf.read_bytes().startswith(b"%PDF")
    print(f"printed: {pdf}")
    after = page.log()  # nothing went wrong while resizing or printing either
    assert after.console == [], after.console
