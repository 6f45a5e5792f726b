"""``kvbench serve`` as a user runs it: bad settings refused in one line, and a real server process stopped by
SIGTERM or Ctrl-C under load: every request answered (finished, or a 503), exit 0 once every KV block is back."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from serve_process import start_serve

from kvbench.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--engine", "bogus"], "unknown --engine"),
        (["--grace-period", "-1"], "--grace-period"),
        (["--admission", "reject"], "--admission and --reserve"),
        (["--engine", "contiguous", "--kv-memory", "64KiB"], "could never run"),
        (["--kv-memory", "abc"], "--kv-memory"),
        (["--max-len", "100000"], "context"),
        (["--model", "/nonexistent"], "/nonexistent"),
        (["--host", " "], "--host"),
    ],
)
def test_bad_settings_are_one_error_line(args, words, capfd):
    assert main(["serve", "--device", "cpu", "--threads", "1", *args]) == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], captured.err


def test_a_port_in_use_is_refused(capfd):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--kv-memory", "1MiB", "--device", "cpu", "--threads", "1"]) == 2
    assert f"port {port} on 127.0.0.1 is already in use" in capfd.readouterr().err


def test_an_address_this_machine_lacks_is_refused_before_the_model_loads_and_without_a_warning(capfd):
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): no machine has it, so binding it fails here and nothing is sent
    assert main(["serve", "--host", "192.0.2.1", "--device", "cpu", "--threads", "1"]) == 2
    err = capfd.readouterr().err
    assert [line for line in err.splitlines() if line.strip()] == [
        "error: cannot listen on 192.0.2.1:8000: Cannot assign requested address"
    ]


def _start(*extra: str) -> tuple[subprocess.Popen, str]:
    process, url, _ = _start_with_engine(*extra)
    return process, url


def _start_with_engine(*extra: str) -> tuple[subprocess.Popen, str, int]:
    """A ``kvbench serve`` process, its URL and the pid of its engine process (from its start-up lines)."""
    return start_serve(*extra)


async def _stream(session, url: str, index: int, max_tokens: int) -> tuple[int, list[dict]]:
    body = {"prompt": [index + 1, 2, 3], "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    async with session.post(url + "/v1/completions", json=body) as response:
        raw = (await response.read()).decode()
    if response.status != 200:
        return response.status, [json.loads(raw)]
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""], raw[-300:]
    return 200, [json.loads(e.removeprefix("data: ")) for e in events[:-2]]


async def _running(session, url: str) -> float:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    return float(re.search(r"^kvbench_requests_running\{[^}]*\} (\S+)$", text, re.MULTILINE).group(1))


def _stop(process: subprocess.Popen, *signals: signal.Signals) -> tuple[int, str]:
    for sig in signals:
        process.send_signal(sig)
        time.sleep(0.3)
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, err


def test_sigterm_under_load_answers_every_request_and_exits_0():
    # a grace period far shorter than the requests: on a fast CPU 8 x 2,000 tokens of the tiny preset end in ~2 s
    process, url = _start("--grace-period", "0.5")

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
            tasks = [asyncio.create_task(_stream(session, url, i, 2000)) for i in range(8)]
            for _ in range(500):
                if await _running(session, url) == 8:
                    break
                await asyncio.sleep(0.02)
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)  # within the grace period: the server still answers, refusing new work
            async with session.get(url + "/health") as health:
                refused_health = health.status
            late = await _stream(session, url, 99, 5)
            return refused_health, late, await asyncio.gather(*tasks)

    try:
        refused_health, late, answers = asyncio.run(scenario())
    finally:
        code, err = _stop(process)
    assert refused_health == 503
    assert late[0] == 503 and "shutting down" in late[1][0]["error"]["message"]
    for status, events in answers:  # every one answered: its tokens so far, then the 503 as an event
        assert status == 200 and events[-1]["error"]["code"] == 503
        assert sum(len(e["choices"][0]["token_ids"]) for e in events[:-1]) > 0
    assert code == 0, err
    assert "0 request(s) finished in the grace period, 8 withdrawn with a 503" in err
    assert "every KV block is back in the pool" in err and "Traceback" not in err


def test_requests_that_finish_in_the_grace_period_finish():
    process, url = _start("--grace-period", "60")

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
            tasks = [asyncio.create_task(_stream(session, url, i, 300)) for i in range(4)]
            for _ in range(500):
                if await _running(session, url) == 4:
                    break
                await asyncio.sleep(0.02)
            process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks)

    try:
        answers = asyncio.run(scenario())
    finally:
        code, err = _stop(process)
    for status, events in answers:
        assert status == 200 and events[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(len(e["choices"][0]["token_ids"]) for e in events) == 300
    assert code == 0 and "4 request(s) finished in the grace period, 0 withdrawn" in err, err


def test_a_second_ctrl_c_cuts_the_grace_period_short():
    process, url = _start("--grace-period", "600")

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
            task = asyncio.create_task(_stream(session, url, 1, 2000))
            for _ in range(500):
                if await _running(session, url) == 1:
                    break
                await asyncio.sleep(0.02)
            start = time.time()
            stopped = asyncio.get_running_loop().run_in_executor(None, _stop, process, signal.SIGINT, signal.SIGINT)
            answer = await task
            code, err = await stopped
            return code, err, time.time() - start, answer

    try:
        code, err, seconds, (status, events) = asyncio.run(scenario())
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0 and seconds < 60 and "again" in err, err
    assert "1 withdrawn with a 503" in err and "Traceback" not in err
    assert status == 200 and events[-1]["error"]["code"] == 503


def _gone(pid: int, within_s: float = 15.0) -> bool:
    """True once ``pid`` has ended (a zombie counts: it runs nothing); ours to ask, not to reap."""
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _engine_parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_engine_process_ends_with_the_server_even_when_the_server_is_killed():
    process, url, engine_pid = _start_with_engine()
    try:
        parent = _engine_parent(engine_pid)
        front_end_maps = Path(f"/proc/{process.pid}/maps").read_text()
        engine_maps = Path(f"/proc/{engine_pid}/maps").read_text()
    finally:
        code, err = _stop(process, signal.SIGTERM)
    assert parent == process.pid  # the server's own child, not a stray one
    # the front end holds no model: torch loads in the engine process only (start-up time and memory)
    assert "libtorch" in engine_maps and "libtorch" not in front_end_maps
    assert code == 0, err
    assert _gone(engine_pid), "the engine process outlived a server stopped by SIGTERM"

    process, url, engine_pid = _start_with_engine()
    process.kill()  # no chance to clean up: the kernel ends the engine with its parent
    process.communicate(timeout=60)
    assert _gone(engine_pid), "the engine process outlived a killed server (an orphan holding its memory)"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_engine_process_fails_requests_in_flight_and_the_server_exits_1_with_one_line():
    process, url, engine_pid = _start_with_engine()

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
            streamed = asyncio.create_task(_stream(session, url, 1, 2000))
            body = {"prompt": [5, 6, 7], "max_tokens": 2000, "ignore_eos": True}
            complete = asyncio.create_task(session.post(url + "/v1/completions", json=body))
            for _ in range(500):
                if await _running(session, url) == 2:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the requests did not start")
            os.kill(engine_pid, signal.SIGKILL)
            status, events = await streamed
            response = await complete
            return status, events, response.status, await response.json()

    try:
        status, events, complete_status, complete_body = asyncio.run(scenario())
    finally:
        code, err = _stop(process)
    # the stream had begun: its tokens so far, then the reason as an error event; the other one a 500
    assert status == 200 and events[-1]["error"]["code"] == 500
    assert "killed by SIGKILL" in events[-1]["error"]["message"]
    assert complete_status == 500 and "killed by SIGKILL" in complete_body["error"]["message"]
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if "engine process ended" in line]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "killed by SIGKILL" in errors[0], err
    assert "Traceback" not in err


def test_kv_event_addresses_beyond_loopback_are_said():
    from kvbench.commands.serve_cmd import exposed_event_addresses
    from kvbench.serve.settings import ServeOptions

    near = ServeOptions(kv_events="tcp://127.0.0.1:5557", kv_events_replay="ipc:///tmp/replay")
    assert exposed_event_addresses(near) == []
    assert exposed_event_addresses(ServeOptions(kv_events="tcp://[::1]:5557")) == []
    far = ServeOptions(kv_events="tcp://0.0.0.0:5557", kv_events_replay="tcp://10.0.0.2:5558")
    assert exposed_event_addresses(far) == [
        ("--kv-events", "tcp://0.0.0.0:5557"),
        ("--kv-events-replay", "tcp://10.0.0.2:5558"),
    ]
