"""Shared fixtures of the command tests: a tiny, quick sweep scenario."""

from __future__ import annotations

import pytest

QUICK_SCENARIO = """
description = "test: tiny and quick"
max_len = 64
mean_len = 16
distribution = "uniform"
sigma = 0.5
prompt_ratio = 0.5
requests = 6
warmup = 1
concurrency = [2, 4]
block_size = 4
reserve = "max"
admission = "queue"

[budget]
slots = 160
"""


@pytest.fixture()
def scenario_text() -> str:
    """The scenario's TOML; a test module may override this fixture to change a field."""
    return QUICK_SCENARIO


@pytest.fixture()
def scenario(tmp_path, scenario_text: str) -> str:
    """Path of the scenario file written from ``scenario_text``."""
    path = tmp_path / "quick.toml"
    path.write_text(scenario_text)
    return str(path)
