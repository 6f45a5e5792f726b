"""The README and docs/ say what the CLI does: the command table is the CLI's, the preset lists are the presets,
every link between pages lands on a file and a heading that exist, and the README stays a first screen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvbench.cli import COMMANDS
from kvbench.env_settings import VARIABLES
from kvbench.models.gpus import GPU_PRESETS
from kvbench.models.shapes import MODEL_PRESETS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
    return {_slug(h) for h in re.findall(r"(?m)^#{1,6} (.+)$", text)}


def test_the_readme_is_a_first_screen_not_the_manual():
    assert len(README.read_text().splitlines()) < 400
    assert max(len(line) for line in README.read_text().splitlines()) <= 300


def test_the_readme_lists_every_command_with_its_own_summary():
    rows = re.findall(r"(?m)^\| `kvbench (\w+)[^`]*` \| (.+) \|$", README.read_text())
    assert [name for name, _ in rows] == list(COMMANDS)
    for name, summary in rows:
        assert summary == COMMANDS[name].summary


def test_the_preset_lists_are_the_presets():
    models = (ROOT / "docs" / "MODELS.md").read_text()
    gpus = re.search(r"GPU presets \(`--gpu`\): (.+?); or", models, re.S)
    assert gpus is not None
    assert re.findall(r"`([^`]+)`", gpus.group(1)) == list(GPU_PRESETS)
    listed = re.search(r"Model presets: (.+?); or", models, re.S)
    assert listed is not None
    assert re.findall(r"`([^`]+)`(?: \(|,| *$)", listed.group(1).replace("\n", " ")) == list(MODEL_PRESETS)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_between_pages_lands(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        where = page if not path else (page.parent / path).resolve()
        assert where.exists(), f"{page.name}: {target} names no file"
        if anchor and where.suffix == ".md":
            assert anchor in _anchors(where), f"{page.name}: {target} names no heading of {where.name}"


def test_every_environment_variable_is_read_through_the_registry_and_documented():
    """A KVBENCH_* name in the package is one of env_settings' VARIABLES, and docs/COMMANDS.md lists exactly those."""
    package = ROOT / "kvbench"
    named = {m for path in package.rglob("*.py") for m in re.findall(r"KVBENCH_[A-Z0-9_]+", path.read_text())}
    assert named <= set(VARIABLES), named - set(VARIABLES)
    documented = re.findall(r"(?m)^\| `(KVBENCH_[A-Z0-9_]+)` \|", (ROOT / "docs" / "COMMANDS.md").read_text())
    assert documented == list(VARIABLES)
    direct = [
        path.name
        for path in package.rglob("*.py")
        if path.name != "env_settings.py" and re.search(r"os\.(environ|getenv)[^\n]*KVBENCH_", path.read_text())
    ]
    assert direct == []  # read where used, a variable escapes the list
