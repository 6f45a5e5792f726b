"""``kvbench fleet --target``: routing across servers over HTTP, against the fake OpenAI server (fast, and able to
fail on purpose): every request ends once on the server that had it, a failing or killed server is marked and the
run goes on without it, and every flag that cannot go with servers is refused in one line.

The same command against ``kvbench serve`` replicas with their KV events is ``tests/serve/test_fleet_servers.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.results.fleet_meta import FleetMeta
from kvbench.results.fleet_summary import FleetSummary
from kvbench.results.simulator_check import SimulatorCheck
from kvbench.studies.fleet.routing import DEFAULT_POLICIES

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "endpoint"))
import fake_server  # noqa: E402
from fake_server import config_json, serve_in_thread  # noqa: E402

FAKE = str(Path(__file__).resolve().parents[2] / "endpoint" / "fake_server.py")


def requests_file(path: Path, count: int, gap_s: float, groups: int = 3, prompt: int = 40, output: int = 6) -> Path:
    """``count`` requests ``gap_s`` apart, group ``i % groups`` sharing its first 32 tokens."""
    with path.open("w") as out:
        for index in range(count):
            group = index % groups
            ids = [(group * 101 + t * 7) % 400 + 5 for t in range(32)] + [(index * 13 + t) % 400 + 5 for t in range(8)]
            row = {"prompt_token_ids": ids[:prompt], "output_len": output, "arrival_time": index * gap_s}
            out.write(json.dumps(row) + "\n")
    return path


def fleet(capsys, *args: str) -> tuple[int, str]:
    """Exit code and everything printed (stdout, then stderr, where one-line errors go)."""
    code = main(["fleet", *args])
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def test_every_policy_runs_over_http_and_every_request_ends_once(tmp_path, capsys):
    file = requests_file(tmp_path / "requests.jsonl", 18, 0.02)
    with serve_in_thread(ttft_s=0.005, itl_s=0.001) as a, serve_in_thread(ttft_s=0.005, itl_s=0.001) as b:
        code, output = fleet(
            capsys,
            "--target", f"a={a.url}", "--target", f"b={b.url}", "--requests-file", str(file),
            "--scrape-interval", "0.05", "--slo", "ttft=1000", "--out", str(tmp_path / "run"),
        )  # fmt: skip
        assert a.state.resets >= len(DEFAULT_POLICIES) and b.state.resets >= len(DEFAULT_POLICIES)
    assert code == 0, output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    points = summary["points"]
    assert [p["policy"] for p in points] == list(DEFAULT_POLICIES)  # no KV events heard: precise-prefix left out
    for point in points:
        assert point["completed"] == 18 and point["rejected"] == 0, point["policy"]
        assert [s["name"] for s in point["instances"]] == ["a", "b"]
        assert [s["routed"] for s in point["instances"]] == [s["finished"] for s in point["instances"]]
        assert sum(s["routed"] for s in point["instances"]) == 18
        assert point["request_goodput"] > 0 and point["slo_met_share"] == 1.0
        series = json.loads((tmp_path / "run" / f"fleet-{point['policy']}.json").read_text())
        routed = [s["routed"] for s in point["instances"]]
        assert [series["placement"].count(index) for index in (0, 1)] == routed
    round_robin = points[0]["instances"]
    assert [s["routed"] for s in round_robin] == [9, 9]
    assert summary["meta"]["servers"] == [
        {"name": "a", "url": a.url, "kv_events": None},
        {"name": "b", "url": b.url, "kv_events": None},
    ]
    check = json.loads((tmp_path / "run" / "simulator-check.json").read_text())
    assert [row["policy"] for row in check["policies"]] == list(DEFAULT_POLICIES)
    assert check["policies"][0]["share_real"] == [0.5, 0.5] == check["policies"][0]["share_simulated"]
    assert check["timing"]["decode_s"] > 0 and check["blocks_per_instance"] == [1000, 1000]
    assert "The simulator against this run" in (tmp_path / "run" / "summary.md").read_text()
    # the typed results write these files back key for key (kvbench.results.fleet_point, simulator_check)
    assert json.dumps(FleetSummary.from_json(summary).to_json()) == json.dumps(summary)
    assert json.dumps(SimulatorCheck.from_json(check).to_json()) == json.dumps(check)
    assert FleetMeta.from_json(summary["meta"]).simulator_check == SimulatorCheck.from_json(check)


def test_most_free_blocks_follows_the_larger_pool_and_the_simulator_gives_each_twin_its_servers_pool(tmp_path, capsys):
    file = requests_file(tmp_path / "requests.jsonl", 24, 0.02)
    big = serve_in_thread(ttft_s=0.005, itl_s=0.002)
    with big as a, serve_in_thread(ttft_s=0.005, itl_s=0.002, capacity_blocks=60) as b:
        code, output = fleet(
            capsys,
            "--target", f"a={a.url}", "--target", f"b={b.url}", "--requests-file", str(file),
            "--policies", "most-free-blocks", "--scrape-interval", "0.05", "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert code == 0, output
    (point,) = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    assert [s["routed"] for s in point["instances"]] == [24, 0]  # a's 1,000 free blocks always beat b's 60
    check = json.loads((tmp_path / "run" / "simulator-check.json").read_text())
    assert check["blocks_per_instance"] == [1000, 60]  # each twin its own server's pool, not the smaller for both
    assert check["policies"][0]["share_simulated"] == [1.0, 0.0]


def test_a_server_that_fails_every_request_is_marked_and_the_others_serve_the_rest(tmp_path, capsys):
    file = requests_file(tmp_path / "requests.jsonl", 20, 0.03)
    with serve_in_thread(ttft_s=0.002) as good, serve_in_thread(faults=["500"]) as bad:
        code, output = fleet(
            capsys,
            "--target", f"good={good.url}", "--target", f"bad={bad.url}", "--requests-file", str(file),
            "--policies", "round-robin", "--scrape-interval", "0.05", "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert code == 1, output
    assert "server bad died under round-robin: 3 requests in a row failed" in output.replace("\n", " ")
    (point,) = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    good_server, bad_server = point["instances"]
    failed = bad_server["routed"]  # 3, or one more sent while the third failure was on its way back
    assert bad_server["state"] == "dead" and failed in (3, 4) and bad_server["finished"] == 0
    assert good_server["routed"] == good_server["finished"] == 20 - failed == point["completed"]
    assert point["rejected"] == failed and point["rejected_by_reason"] == {"http": failed}


def test_a_server_killed_mid_run_ends_the_run_with_exit_1_naming_it_and_keeps_the_rest(tmp_path, capsys):
    file = requests_file(tmp_path / "requests.jsonl", 40, 0.05)
    process = subprocess.Popen(
        [sys.executable, FAKE, config_json(ttft_s=0.002, itl_s=0.002, announce=True)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline().split()[1])

        def kill_after_five_requests() -> None:  # mid-run on any machine, however slow the run's start
            for line in process.stdout:
                if line.startswith("REQUEST 4"):
                    process.kill()
                    return

        killer = threading.Thread(target=kill_after_five_requests, daemon=True)
        killer.start()
        with serve_in_thread(ttft_s=0.002, itl_s=0.002) as alive:
            code, output = fleet(
                capsys,
                "--target", f"alive={alive.url}", "--target", f"doomed=http://127.0.0.1:{port}",
                "--requests-file", str(file), "--policies", "round-robin,least-requests",
                "--scrape-interval", "0.1", "--out", str(tmp_path / "run"),
            )  # fmt: skip
    finally:
        process.kill()
        process.wait()
    assert code == 1, output
    assert "server doomed died under round-robin" in output.replace("\n", " ")
    assert "1 instance died: doomed under round-robin" in output.replace("\n", " ")  # the verdict says so too
    points = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    assert [p["policy"] for p in points] == ["round-robin", "least-requests"]
    first, second = points
    assert first["completed"] + first["rejected"] == 40 and first["completed"] >= 38
    alive_server, doomed = first["instances"]
    assert doomed["state"] == "dead" and 5 <= doomed["routed"] < 20
    assert alive_server["finished"] == alive_server["routed"]
    assert second["completed"] == 40 and second["instances"][1]["routed"] == 0  # dead since the first policy
    assert second["instances"][1]["failure"] == "dead since an earlier policy"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-events", "5557"], "--kv-events names a --target's KV event stream"),
        (["--target", "a=http://127.0.0.1:9", "--kv-events", "c=5557"], "no --target is named 'c'"),
        (
            ["--target", "a=http://127.0.0.1:9", "--target", "b=http://127.0.0.1:10", "--kv-events", "5557"],
            "name its server",
        ),
        (["--target", "a=http://127.0.0.1:9", "--target", "a=http://127.0.0.1:10"], "--target names must differ"),
        (["--target", "a=http://127.0.0.1:9", "--instances", "3"], "--instances 3 with 1 --target"),
        (["--target", "a=http://127.0.0.1:9", "--simulate"], "--simulate sets up kvbench's own instances"),
        (["--target", "a=http://127.0.0.1:9", "--autoscale"], "--autoscale sets up kvbench's own instances"),
        (["--target", "a=http://127.0.0.1:9", "--kv-memory", "4MiB"], "--kv-memory sets up"),
        (["--target", "a=http://127.0.0.1:9", "--metrics-port", "0"], "servers export their own"),
        (["--target", "a=http://127.0.0.1:9", "--policies", "precise-prefix"], "give --kv-events for every --target"),
        (["--policies", "precise-prefix"], "run it with --simulate"),
        (["--prefix-weight", "-1"], "--prefix-weight must be a non-negative number"),
        (["--prefix-weight", "0", "--load-weight", "0"], "would weigh nothing"),
        (["--prefix-ttl", "0"], "--prefix-ttl must be a positive number"),
        (["--slo", "ttft=abc"], "not a number of milliseconds"),
        (["--target", "ftp://127.0.0.1:9"], "expected [NAME=]http://HOST:PORT"),
        (["--target", "a=http://127.0.0.1:9", "--scrape-interval", "0"], "greater than or equal to 0.05"),
    ],
)
def test_what_cannot_go_with_servers_is_refused_in_one_line(args, message, tmp_path, capsys):
    code, output = fleet(capsys, *args, "--out", str(tmp_path / "run"))
    assert code != 0 and message in output.replace("\n", " "), output
    assert "Traceback" not in output and not (tmp_path / "run").exists()


def test_a_server_that_cannot_be_reached_is_refused_before_any_load(tmp_path, capsys):
    with serve_in_thread() as a:
        code, output = fleet(
            capsys,
            "--target", f"a={a.url}", "--target", "gone=http://127.0.0.1:9", "--rate", "5", "--requests", "4",
            "--out", str(tmp_path / "run"),
        )  # fmt: skip
        assert a.state.count == 0
    assert code != 0 and "gone:" in output and "Traceback" not in output


def _lying(monkeypatch, replace_line) -> None:
    """The fake servers' /metrics with each line passed through ``replace_line(line, scrape number)``."""
    honest = fake_server.metrics_text
    scrapes = {"n": 0}

    def lying(state) -> str:
        scrapes["n"] += 1
        lines = honest(state).split("\n")
        return "\n".join(line if line.startswith("#") else replace_line(line, scrapes["n"]) for line in lines)

    monkeypatch.setattr(fake_server, "metrics_text", lying)


@pytest.mark.parametrize(
    ("name", "replace_line", "note"),
    [
        (
            "counters that go back",  # an engine restarted: the counters start again below the policy's base
            lambda line, n: line.rsplit(" ", 1)[0] + f" {1e6 if n <= 3 else 0}" if "prefix_cache" in line else line,
            "prefix hit rate unknown",
        ),
        (
            "more hits than lookups",
            lambda line, n: line.rsplit(" ", 1)[0] + " 1e9" if "prefix_cache_hits" in line else line,
            "prefix hit rate unknown",
        ),
        (
            "a usage of 170%",
            lambda line, n: line.rsplit(" ", 1)[0] + " 1.7" if "kv_cache_usage_perc" in line else line,
            "KV usage unread",
        ),
    ],
)
def test_figures_a_server_cannot_mean_are_unknown_never_reported(
    tmp_path, capsys, monkeypatch, name, replace_line, note
):
    file = requests_file(tmp_path / "requests.jsonl", 12, 0.03)
    _lying(monkeypatch, replace_line)
    with serve_in_thread(ttft_s=0.002) as a:
        code, output = fleet(
            capsys, "--target", f"a={a.url}", "--requests-file", str(file), "--policies", "round-robin",
            "--scrape-interval", "0.05", "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert code == 0, output
    (point,) = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    (server,) = point["instances"]
    assert any(note in line for line in point["notes"]), point["notes"]
    assert note in output.replace("\n", " ")  # the verdict says it
    if "hit rate" in note:
        assert server["prefix_hit_rate"] is None and point["prefix_hit_rate"] is None
    else:
        assert server["usage_peak"] is None and point["completed"] == 12
    for value in (point["prefix_hit_rate"], server["prefix_hit_rate"], server["usage_peak"]):
        assert value is None or 0 <= value <= 1


def test_failures_are_counted_in_the_order_they_were_sent(tmp_path, capsys):
    """One request in three refused (429) and answered at once, the others slow: finishing, two refusals can
    overtake the success sent between them; the server is not dead for that."""
    file = requests_file(tmp_path / "requests.jsonl", 30, 0.01)
    with serve_in_thread(itl_s=0.01, faults=["", "", "429"]) as flaky:
        code, output = fleet(
            capsys, "--target", f"flaky={flaky.url}", "--requests-file", str(file), "--policies", "round-robin",
            "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert code == 0, output
    (point,) = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    assert point["instances"][0]["state"] == "serving" and point["rejected"] == 10 and point["completed"] == 20


def test_precise_prefix_says_when_a_server_sent_no_kv_event(tmp_path, capsys):
    file = requests_file(tmp_path / "requests.jsonl", 6, 0.02)
    with serve_in_thread() as a:
        code, output = fleet(
            capsys, "--target", f"a={a.url}", "--kv-events", f"a=ipc://{tmp_path}/silent",
            "--requests-file", str(file), "--policies", "precise-prefix", "--out", str(tmp_path / "run"),
        )  # fmt: skip
    assert code == 0, output
    (point,) = json.loads((tmp_path / "run" / "summary.json").read_text())["points"]
    assert point["notes"] == ["no KV event came from a: it was routed by its load alone"]
