"""Every run kind's report.html is one self-contained, well-formed, deterministic page: no request can leave it
(a Content-Security-Policy forbids it, and nothing asks), its script is the one the policy allows, ids are unique,
every plot is inline, and the same files give the same bytes."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from report_page import by_id, parse, section_ids

from kvbench.report.html import REPORT_FILE, render_run

KINDS = ["sweep_run", "oom_sweep_run", "waste_run", "fleet_run", "share_run", "dataset_run"]


def _page_text(request, name: str) -> str:
    if name == "compare_report":
        return request.getfixturevalue(name).read_text()
    return (request.getfixturevalue(name) / REPORT_FILE).read_text()


@pytest.mark.parametrize("name", [*KINDS, "compare_report"])
def test_the_page_is_self_contained(request, name):
    text = _page_text(request, name)
    page = parse(text)
    csp = page.find("meta", http_equiv="Content-Security-Policy").attrs["content"]
    assert "default-src 'none'" in csp and "img-src data:" in csp
    (script,) = [n for n in page.find_all("script")]
    body = text.split("<script>", 1)[1].split("</script>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp  # the inline script is exactly the one the policy lets run
    assert "src" not in script.attrs
    for node in page.walk():  # nothing points outside the file
        for attr in ("src", "href", "action", "srcset", "poster", "data"):
            value = node.attrs.get(attr, "")
            if value and node.tag not in ("use",):
                assert value.startswith(("#", "data:")), f"<{node.tag} {attr}={value[:60]}>"
        assert node.tag not in ("link", "iframe", "object", "embed", "base")
    assert not re.search(r"url\((?!#)", text), "a CSS url() other than a same-document reference"
    assert not re.search(r"@import|https?://(?!www\.w3\.org/(1999/xlink|2000/svg))", text)
    ids = [n.attrs["id"] for n in page.walk() if "id" in n.attrs]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    for ref in page.walk():  # every aria reference names an element of the page
        for attr in ("aria-labelledby", "aria-describedby"):
            if attr in ref.attrs:
                by_id(page, ref.attrs[attr])
    assert page.find("html").attrs["lang"] == "en" and page.find("title").text()
    assert page.find("meta", name="viewport") is not None


@pytest.mark.parametrize("name", KINDS)
def test_the_headline_comes_first_and_provenance_last(request, name):
    page = parse(_page_text(request, name))
    sections = section_ids(page)
    assert sections[0] == "headline" and sections[-1] == "provenance"
    order = ["headline", "findings", "plots", "points", "waterfall", "provenance"]
    assert [s for s in order if s in sections] == sections
    assert by_id(page, "verdict-headline").text()
    nav = [a.attrs["href"] for a in page.find("nav").find_all("a")]
    assert nav == [f"#{s}" for s in sections]


@pytest.mark.parametrize("name", ["waste_run", "fleet_run", "dataset_run"])
def test_the_same_files_give_the_same_bytes(request, name):
    run = request.getfixturevalue(name)
    assert render_run(run) == (run / REPORT_FILE).read_text()


def test_strings_from_the_run_are_escaped(sweep_run, copy_run):
    import json

    run = copy_run(sweep_run)
    summary = json.loads((run / "summary.json").read_text())
    summary["meta"]["scenario_description"] = '<script>alert(1)</script><img src="http://example.com/x">'
    (run / "summary.json").write_text(json.dumps(summary))
    text = render_run(run)
    assert "<script>alert(1)" not in text and '<img src="http://example.com' not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
