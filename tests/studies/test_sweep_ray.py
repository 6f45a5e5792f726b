"""``sweep --ray``: points fanned out to Ray workers give a run directory identical in content to a local sweep
(checked on --simulate, where every figure is deterministic)."""

from __future__ import annotations

import json

import pytest

from kvbench.cli import main


def test_sweep_on_ray_equals_the_local_sweep(tmp_path, ray_local):
    args = ["sweep", "--simulate", "--concurrency", "5,20", "--requests", "60", "--json"]
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    assert main([*args, "--out", str(tmp_path / "ray"), "--ray"]) == 0
    local = json.loads((tmp_path / "local" / "summary.json").read_text())
    fanned = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert fanned["points"] == local["points"] and len(local["points"]) == 4
    for path in (tmp_path / "local").glob("timeline-*.json"):
        assert (tmp_path / "ray" / path.name).read_text() == path.read_text()
    lines = lambda run: sorted((tmp_path / run / "results.jsonl").read_text().splitlines())  # noqa: E731
    assert lines("ray") == lines("local")


def test_ray_options_go_with_ray(tmp_path, capsys):
    assert main(["sweep", "--simulate", "--ray-workers", "2", "--out", str(tmp_path / "x")]) == 2
    assert "--ray-workers and --ray-address go with --ray" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["127.0.0.1:1", "nowhere"])
def test_an_unreachable_or_malformed_ray_address_is_a_one_line_error(tmp_path, capsys, address):
    assert main(["sweep", "--simulate", "--ray", "--ray-address", address, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and ("cannot reach" in err[0] or "HOST:PORT" in err[0])
