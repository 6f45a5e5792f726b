"""``kvbench watch`` against a fake vLLM endpoint on 127.0.0.1: live table, timeline, plot, Ctrl-C, diagnose."""

from __future__ import annotations

import json
import socket

import pytest

from kvbench.cli import main


def queue_growing(vllm_exposition) -> list[str]:
    """A vLLM server whose queue grows while its KV cache stays at 20%: the batch cap limits it."""
    return [
        vllm_exposition(usage=0.2, running=8, waiting=w, waiting_capacity=w, preemptions=p)
        for w, p in ((0, 0), (3, 0), (6, 1), (10, 1), (15, 2), (21, 2), (28, 3))
    ]


def test_watch_records_a_timeline_and_a_plot_then_diagnose_reads_it(
    tmp_path, metrics_server, vllm_exposition, monkeypatch, capsys
):
    import kvbench.studies.watch as watch_study

    _virtual_time(monkeypatch, watch_study)  # scrape back to back, on a clock a slow machine cannot run out
    server = metrics_server.serve(queue_growing(vllm_exposition))
    out = tmp_path / "w"
    assert (
        main(
            ["watch", "--metrics-url", server.url, "--scrape-interval", "0.05", "--duration", "0.3", "--out", str(out)]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "kvbench watch" in text and "waiting" in text and "vLLM engine=0" in text
    lines = (out / "timeline.jsonl").read_text().splitlines()
    header, samples = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    assert header["kind"] == "kvbench-watch" and header["url"] == server.url
    assert len(samples) == 7  # t = 0, 0.05, ..., 0.3
    assert [s["state"]["waiting"] for s in samples] == [0, 3, 6, 10, 15, 21, 28]
    png = (out / "watch.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert main(["diagnose", str(out / "timeline.jsonl"), "--check", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    capped = next(f for f in result["findings"] if f["rule"] == "concurrency_capped")
    assert capped["severity"] == "warning" and "grew from 0 to 28" in capped["evidence"]
    assert "--max-num-seqs" in capped["suggestion"]
    assert main(["diagnose", str(out), "--check"]) == 1  # the folder works too


def test_ctrl_c_stops_cleanly_and_keeps_what_was_scraped(
    tmp_path, metrics_server, vllm_exposition, monkeypatch, capsys
):
    import kvbench.studies.watch as watch_study

    pauses = {"n": 0}

    def sleep(seconds: float) -> None:
        pauses["n"] += 1
        if pauses["n"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(watch_study, "_sleep", sleep)
    server = metrics_server.serve(queue_growing(vllm_exposition))
    out = tmp_path / "w"
    assert (
        main(["watch", "--metrics-url", server.url, "--scrape-interval", "0.05", "--out", str(out)]) == 0
    )  # no --duration
    text = capsys.readouterr().out
    assert "stopped by Ctrl-C" in text and "Traceback" not in text
    assert len((out / "timeline.jsonl").read_text().splitlines()) == 1 + 3
    assert (out / "watch.png").exists()
    assert main(["diagnose", str(out / "timeline.jsonl")]) == 0


def test_a_failed_scrape_mid_watch_is_recorded_and_the_watch_goes_on(
    tmp_path, metrics_server, vllm_exposition, monkeypatch, capsys
):
    import kvbench.studies.watch as watch_study

    _virtual_time(monkeypatch, watch_study)
    server = metrics_server.serve([vllm_exposition(), "<html>busy</html>", vllm_exposition()])
    out = tmp_path / "w"
    assert (
        main(["watch", "--metrics-url", server.url, "--scrape-interval", "0.1", "--duration", "0.2", "--out", str(out)])
        == 0
    )
    records = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()[1:]]
    assert ["error" in r for r in records] == [False, True, False]
    assert "1 failed" in capsys.readouterr().out


def test_bad_urls_fail_before_any_file_is_written(tmp_path, metrics_server, capsys):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "w"
    assert main(["watch", "--metrics-url", f"http://127.0.0.1:{port}/metrics", "--out", str(out)]) == 2
    assert "cannot scrape" in capsys.readouterr().err
    server = metrics_server.serve(["<!DOCTYPE html><html></html>"], "text/html")
    assert main(["watch", "--metrics-url", server.url, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "HTML page" in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--scrape-interval", "0"],
        ["--duration", "-1"],
        ["--scrape-interval", "inf"],
        ["--scrape-interval", "nan"],
        ["--scrape-interval", "1e300"],
        ["--duration", "inf"],
        ["--duration", "nan"],
        ["--duration", "1e20"],
    ],
)
def test_bad_interval_or_duration(args, capsys):
    """Refused before any scrape (an infinite interval overflowed the pause between scrapes)."""
    assert main(["watch", "--metrics-url", "http://127.0.0.1:1/metrics", *args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and err.startswith(f"error: Invalid value for '{args[0]}'") and len(err.splitlines()) == 1


def test_watch_listens_to_a_kv_event_stream_shows_its_rates_and_keeps_it(
    tmp_path, metrics_server, vllm_exposition, capsys
):
    import threading
    import time

    import zmq

    from kvbench.measure.kv_events import BlockRemoved, BlockStored, EventBatch, encode_batch, sequence_bytes
    from kvbench.measure.kv_residency import read_kv_events_text

    server = metrics_server.serve([vllm_exposition(usage=0.5)])
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    address = f"ipc://{tmp_path}/events"
    pub.bind(address)
    stop = threading.Event()

    def publish() -> None:  # a block stored every 20 ms, and the one before it removed
        seq = 0
        while not stop.is_set() and seq < 200:
            events = [BlockStored([seq], None, [1] * 4, 4)] + ([BlockRemoved([seq - 1])] if seq else [])
            pub.send_multipart((b"", sequence_bytes(seq), encode_batch(EventBatch(time.time(), events))))
            seq += 1
            time.sleep(0.02)

    thread = threading.Thread(target=publish)
    thread.start()
    out = tmp_path / "w"
    try:
        args = [
            "watch",
            "--metrics-url",
            server.url,
            "--scrape-interval",
            "0.3",
            "--duration",
            "1.5",
            "--kv-events",
            address,
        ]
        assert main([*args, "--out", str(out)]) == 0
    finally:
        stop.set()
        thread.join()
        pub.close(0)
        context.term()
    text = capsys.readouterr().out
    assert "KV events:" in text and "stored/s" in text and "blocks resident" in text
    figures, rows = read_kv_events_text((out / "kv-events.jsonl").read_text())
    assert figures["kv_blocks_stored"] > 10 and figures["kv_blocks_removed"] > 5 and rows


def test_watch_refuses_bad_kv_event_options(tmp_path, metrics_server, vllm_exposition, capsys):
    server = metrics_server.serve([vllm_exposition(usage=0.5)])
    for extra in (["--kv-events", "tcp://*:5557"], ["--kv-events-replay", "5558"], ["--kv-events-bind"]):
        assert (
            main(["watch", "--metrics-url", server.url, "--duration", "0", "--out", str(tmp_path / "w"), *extra]) == 2
        )
        err = capsys.readouterr().err
        assert err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()


def test_slow_scrapes_end_the_watch_at_its_duration_not_after_its_count(tmp_path, monkeypatch):
    """Scrapes of 4 s each on a 1 s interval: a 4 s watch ends after about 4 s of wall time, not after 5 scrapes
    (20 s); the clock here is simulated, each scrape advancing it by 4 s."""
    from kvbench.studies import watch as watch_module
    from kvbench.studies.watch import WatchSettings, watch

    now = [0.0]

    def slow_read(url, timeout):
        now[0] += 4.0
        return []

    monkeypatch.setattr(watch_module, "read_endpoint", slow_read)
    settings = WatchSettings("http://127.0.0.1:1/metrics", 1.0, 4.0, tmp_path / "timeline.jsonl")
    count = watch(settings, [], lambda scrape: None, clock=lambda: now[0], sleep=lambda s: None)
    assert count == 2 and now[0] == 4.0  # the first (given) scrape, one slow one, then the duration is spent


def _virtual_time(monkeypatch, watch_study) -> None:
    """The watch's pauses advance a clock of their own instead of waiting: a scrape takes no time on it."""
    now = [0.0]
    monkeypatch.setattr(watch_study, "_clock", lambda: now[0])
    monkeypatch.setattr(watch_study, "_sleep", lambda seconds: now.__setitem__(0, now[0] + seconds))
