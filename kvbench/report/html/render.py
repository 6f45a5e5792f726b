"""A :class:`Page` as one self-contained HTML file: the Jinja2 templates shipped in ``templates/``, their CSS
and JavaScript inlined, every plot inline (SVG, or PNG as a data URI). A Content-Security-Policy in the page
forbids every request: nothing loads from anywhere, even if a string in the data tried."""

from __future__ import annotations

import base64
import hashlib
import html
import re
from functools import cache, lru_cache

from markupsafe import Markup

from kvbench.report.figure_capture import CapturedFigure
from kvbench.report.html.page import Page

TEMPLATE = "report.html.j2"


@lru_cache(maxsize=1)
def _environment():
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("kvbench.report.html", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["figure_markup"] = figure_markup
    env.filters["slug"] = slug
    return env


@cache
def _asset(name: str) -> str:
    return _environment().loader.get_source(_environment(), name)[0]


def _csp_hash(script: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")


def render_page(page: Page) -> str:
    script = _asset("report.js")
    csp = (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src '{_csp_hash(script)}'; base-uri 'none'; form-action 'none'"
    )
    return (
        _environment()
        .get_template(TEMPLATE)
        .render(page=page, css=Markup(_asset("report.css")), script=Markup(script), csp=csp)
    )


_SVG_OPEN = re.compile(r"<svg\b")


def figure_markup(figure: CapturedFigure, label_id: str) -> Markup:
    """The plot as an element named by its caption (``aria-labelledby``) and described by its titles."""
    title = html.escape(figure.title or figure.name, quote=True)
    if figure.is_svg:
        svg = _SVG_OPEN.sub(f'<svg role="img" aria-labelledby="{label_id}" class="plot"', figure.data, count=1)
        return Markup(f'<div class="plot-scroll">{svg}</div>')
    return Markup(
        f'<div class="plot-scroll"><img class="plot" src="data:{figure.mime};base64,{figure.data}" alt="{title}" '
        f'aria-describedby="{label_id}"></div>'
    )


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "item"
