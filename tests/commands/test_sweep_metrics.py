"""``kvbench sweep`` with live metrics: the endpoint scraped mid-run, the metrics file, the waterfall."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvbench.cli import main
from kvbench.measure.exporter import KvMetrics


@pytest.fixture()
def scenario_text(scenario_text: str) -> str:
    return scenario_text.replace("concurrency = [2, 4]", "concurrency = [4]")  # one point per engine


def samples_of(text: str) -> dict[str, dict[tuple, float]]:
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def labels(engine: str) -> tuple:
    return (("device", "cpu"), ("engine", engine))


def test_endpoint_scraped_during_the_sweep_agrees_with_the_pool(scenario, tmp_path, monkeypatch, capsys):
    seen = []
    original = KvMetrics.observe

    def observe_and_scrape(self, engine, scheduler, clock=None):
        original(self, engine, scheduler, clock)
        if scheduler is not None and self._runs[engine].steps == 3:  # mid-run, over real HTTP
            with urllib.request.urlopen(self.url, timeout=10) as response:
                samples = samples_of(response.read().decode("utf-8"))
            pool = scheduler.manager.pool
            seen.append(
                (
                    engine,
                    self.host,
                    {
                        "used": (samples["kvbench_kv_cache_blocks_used"][labels(engine)], pool.num_used),
                        "free": (samples["kvbench_kv_cache_blocks_free"][labels(engine)], pool.num_free),
                        "total": (samples["kvbench_kv_cache_blocks_capacity"][labels(engine)], pool.num_blocks),
                        "running": (samples["kvbench_requests_running"][labels(engine)], len(scheduler.running)),
                        "waiting": (samples["kvbench_requests_waiting"][labels(engine)], len(scheduler.waiting)),
                    },
                )
            )

    monkeypatch.setattr(KvMetrics, "observe", observe_and_scrape)
    out, prom = tmp_path / "run", tmp_path / "kvbench.prom"
    assert (
        main(
            [
                "sweep",
                "--device",
                "cpu",
                "--scenario",
                scenario,
                "--out",
                str(out),
                "--metrics-port",
                "0",
                "--metrics-file",
                str(prom),
                "--verbose",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Prometheus metrics: http://127.0.0.1:" in printed and "Memory waterfall, paged C=4" in printed
    assert [engine for engine, _, _ in seen] == ["paged", "contiguous"]
    for engine, host, pairs in seen:
        assert host == "127.0.0.1"
        for name, (scraped, pool) in pairs.items():
            assert scraped == pool, (engine, name)
        assert pairs["used"][1] > 0 and pairs["total"][1] == 40

    summary = json.loads((out / "summary.json").read_text())
    file_samples = samples_of(prom.read_text())
    for point in summary["points"]:
        engine, m = point["engine"], point["metrics"]
        assert m["kv_cache_blocks_total"] == 40 and m["kv_cache_blocks_used"] == 0  # final: all blocks back
        assert m["requests_finished"] == point["completed"] == 6
        assert m["num_preemptions"] == point["preemptions"]
        # live metrics are read at the end of a step, after its finished requests freed their blocks; the
        # accounting snapshot is taken just before, so its peak may be a little higher, never lower
        peak_live = m["kv_cache_blocks_used_peak"] * 4 * (point["kv_pool_bytes"] // 160)
        assert 0 < peak_live <= point["kv_peak_allocated_bytes"]
        assert m["block_alloc_count"] > 0 and m["block_alloc_latency_p99_seconds"] is not None
        assert file_samples["kvbench_generated_tokens_total"][labels(engine)] == m["generated_tokens"] > 0
        assert file_samples["kvbench_block_alloc_latency_seconds_count"][labels(engine)] == m["block_alloc_count"]
        # the waterfall: CPU levels, outer >= inner, all measured on Linux
        levels = point["waterfall"]
        assert [lv["level"] for lv in levels] == ["process RSS", "KV pool", "KV allocated", "token states"]
        sizes = [lv["bytes"] for lv in levels]
        assert None not in sizes and sizes == sorted(sizes, reverse=True)
        assert (out / f"waterfall-{engine}-c4.png").read_bytes()[:4] == b"\x89PNG"
    contiguous = next(p for p in summary["points"] if p["engine"] == "contiguous")
    assert contiguous["metrics"]["kv_cache_fragmentation_max"] > 0.5  # max-len slabs, short requests


def test_port_in_use_fails_clearly_unless_metrics_are_optional(scenario, tmp_path, capsys):
    args = [
        "sweep",
        "--device",
        "cpu",
        "--scenario",
        scenario,
        "--engines",
        "paged",
        "--concurrency",
        "2",
        "--requests",
        "2",
    ]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main([*args, "--out", str(tmp_path / "a"), "--metrics-port", port]) == 2
        err = capsys.readouterr().err.strip()
        assert f"metrics port {port} on 127.0.0.1 is already in use" in err and len(err.splitlines()) == 1
        assert not (tmp_path / "a" / "results.jsonl").exists()  # nothing ran
        prom = tmp_path / "b.prom"
        assert (
            main(
                [
                    *args,
                    "--out",
                    str(tmp_path / "b"),
                    "--metrics-port",
                    port,
                    "--metrics-optional",
                    "--metrics-file",
                    str(prom),
                ]
            )
            == 0
        )
    assert "running without the metrics endpoint" in capsys.readouterr().out
    assert samples_of(prom.read_text())["kvbench_requests_finished_total"][labels("paged")] == 2
    point = json.loads((tmp_path / "b" / "summary.json").read_text())["points"][0]
    assert point["metrics"]["requests_finished"] == 2


def test_metrics_need_the_tensor_engine(tmp_path, capsys):
    assert (
        main(
            [
                "sweep",
                "--simulate",
                "--requests",
                "20",
                "--out",
                str(tmp_path / "s"),
                "--metrics-file",
                str(tmp_path / "m.prom"),
            ]
        )
        == 2
    )
    assert "need the tensor engine" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--metrics-port", "0"], ["--metrics-file", "m.prom"]])
def test_ray_with_metrics_is_refused_before_any_work(flags, tmp_path, monkeypatch, capfd):
    from kvbench.measure import exporter as metrics_module
    from kvbench.studies.sweep_setup import SweepSetup

    def no_work(*args, **kwargs):
        raise AssertionError("work started before --ray with metrics was refused")

    monkeypatch.setattr(SweepSetup, "resolve", no_work)  # the model would load here
    monkeypatch.setattr(metrics_module.KvMetrics, "serve", no_work)
    out = tmp_path / "run"
    args = ["sweep", "--ray", "--device", "cpu", "--out", str(out)]
    args += [flags[0], str(tmp_path / flags[1]) if flags[0] == "--metrics-file" else flags[1]]
    assert main(args) == 2
    captured = capfd.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1 and "with --ray they run in workers" in err, err
    assert not out.exists()  # no run directory, no pinned config
