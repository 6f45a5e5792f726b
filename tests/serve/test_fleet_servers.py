"""``kvbench fleet --target`` across two ``kvbench serve`` replicas publishing their KV events: every routing
policy runs with every request ending once on the server that had it, and precise-prefix sends each request of
a prefix group to the replica whose events say it holds the group's blocks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.results.simulator_check import SimulatorCheck
from kvbench.serve.lifecycle import Server, ServerThread
from kvbench.studies.fleet.routing import POLICIES

from .conftest import tiny_options

BLOCK = 16
PREFIX = 48  # three full blocks shared by a group


@pytest.fixture(scope="module")
def replicas(tiny_model, tmp_path_factory):
    """Two paged servers of 96 blocks each, their KV events on ipc sockets."""
    folder = tmp_path_factory.mktemp("fleet-events")
    servers = []
    try:
        for name in ("a", "b"):
            options = replace(
                tiny_options(tiny_model, num_blocks=96, block_size=BLOCK), kv_events=f"ipc://{folder}/{name}"
            )
            servers.append((name, ServerThread(Server(options, "127.0.0.1", 0)).start()))
        yield servers
    finally:
        for _, server in servers:
            server.stop(grace_s=5.0)


def _group_prompt(group: int, index: int) -> list[int]:
    prefix = [(group * 97 + i * 13) % 400 + 5 for i in range(PREFIX)]
    return prefix + [(group * 31 + index * 7 + i) % 400 + 5 for i in range(9)]


def _write(path: Path, rows: list[tuple[float, int, int]]) -> Path:
    """Rows of (arrival seconds, group, index within the group)."""
    with path.open("w") as out:
        for at, group, index in rows:
            row = {"prompt_token_ids": _group_prompt(group, index), "output_len": 4, "arrival_time": at}
            out.write(json.dumps(row) + "\n")
    return path


def _fleet(capsys, replicas, *args: str) -> tuple[int, str]:
    targets = []
    for name, server in replicas:
        targets += ["--target", f"{name}={server.url}", "--kv-events", f"{name}={server.server.options.kv_events}"]
    code = main(["fleet", *targets, "--scrape-interval", "0.05", *args])
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def test_every_policy_runs_on_two_replicas_and_every_request_ends_once(replicas, tmp_path, capsys):
    rows = [(0.03 * i, i % 3, i // 3) for i in range(30)]  # 0.9 s: scrape intervals enough to fit each policy's steps
    file = _write(tmp_path / "requests.jsonl", rows)
    code, output = _fleet(capsys, replicas, "--requests-file", str(file), "--out", str(tmp_path / "run"))
    assert code == 0, output
    points = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    assert {p["policy"] for p in points} == set(POLICIES)  # every replica heard: precise-prefix runs by default
    for point in points:
        assert point["completed"] == 30 and point["rejected"] == 0 and not point.get("rerouted"), point["policy"]
        for server in point["instances"]:  # sent = finished + failed, and nothing failed
            assert server["routed"] == server["finished"] and server["failure"] is None, point["policy"]
        assert sum(server["routed"] for server in point["instances"]) == 30
        assert not point.get("notes"), point["notes"]  # every prefix cache was reset before every policy
    check = json.loads((tmp_path / "run" / "simulator-check.json").read_text())
    assert check["blocks_per_instance"] == [96, 96] and len(check["policies"]) == len(POLICIES)
    assert check["timed_by"] == "step counters"  # kvbench serve counts its steps: no request's wait in them
    for policy in check["policies"]:  # each simulated with the steps its own run's servers counted
        assert policy["timing"]["decode_s"] > 0, policy["policy"]
    assert json.dumps(SimulatorCheck.from_json(check).to_json()) == json.dumps(check)
    assert "the step times each policy's servers counted in its run" in output.replace("\n", " ")


def test_precise_prefix_sends_every_request_of_a_group_to_the_replica_holding_its_blocks(replicas, tmp_path, capsys):
    # the groups' first requests together (the router spreads them by requests in flight), the rest later, two of
    # a group in a row (round-robin would split each pair; least-requests would send all to one idle replica)
    rows = [(0.0, group, 0) for group in range(4)]
    rows += [(0.6 + 0.04 * i, i // 2 % 4, 1 + i // 8 * 2 + i % 2) for i in range(16)]
    file = _write(tmp_path / "requests.jsonl", rows)
    code, output = _fleet(
        capsys, replicas, "--requests-file", str(file), "--policies", "precise-prefix", "--load-weight", "0.01",
        "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert code == 0, output
    placement = json.loads((tmp_path / "run" / "fleet-precise-prefix.json").read_text())["placement"]
    holder = {group: placement[group] for group in range(4)}
    assert set(holder.values()) == {0, 1}, holder  # both replicas hold groups
    for position, (_, group, _) in enumerate(rows):
        assert placement[position] == holder[group], (position, group, placement)
    (point,) = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    # 16 of 20 requests found their group's 3 blocks (48 of 57 prompt tokens) on the replica they were sent to
    assert point["prefix_hit_rate"] == pytest.approx(16 * PREFIX / (20 * (PREFIX + 9)))
