"""``kvbench serve`` as a user runs it: bad settings refused in one line, and a real server process stopped by
SIGTERM or Ctrl-C under load: every request answered (finished, or a 503), exit 0 once every KV block is back."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from kvbench.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, words", [
    (["--engine", "bogus"], "unknown --engine"),
    (["--grace-period", "-1"], "--grace-period"),
    (["--admission", "reject"], "--admission and --reserve"),
    (["--engine", "contiguous", "--kv-memory", "64KiB"], "could never run"),
    (["--kv-memory", "abc"], "--kv-memory"),
    (["--max-len", "100000"], "context"),
    (["--model", "/nonexistent"], "/nonexistent"),
    (["--host", " "], "--host"),
])
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


def _start(*extra: str) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "kvbench.cli", "serve", "--port", "0", "--kv-memory", "4MiB", "--device", "cpu",
               "--threads", "1", "--log-interval", "0", *extra]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = process.stderr.readline()
        match = re.search(r"serving on (http://\S+)", line)
        if match:
            return process, match.group(1)
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError(f"the server did not start: {process.stderr.read()}")


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
    process, url = _start("--grace-period", "2")

    async def scenario():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
            tasks = [asyncio.create_task(_stream(session, url, i, 2000)) for i in range(8)]
            for _ in range(500):
                if await _running(session, url) == 8:
                    break
                await asyncio.sleep(0.02)
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
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
