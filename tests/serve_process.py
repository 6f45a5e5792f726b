"""``kvbench serve`` as a subprocess on a free loopback port, for the tests that talk to a real server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVE = ["serve", "--port", "0", "--kv-memory", "4MiB", "--device", "cpu", "--threads", "1", "--log-interval", "0"]


def start_serve(*extra: str, stdout: int = subprocess.PIPE) -> tuple[subprocess.Popen, str, int]:
    """A ``kvbench serve`` process (the tiny preset, a 4 MiB pool, one thread), its URL and the pid of its engine
    process, read from its start-up lines; a server that does not start fails the test with its stderr."""
    command = [sys.executable, "-m", "kvbench.cli", *SERVE, *extra]
    process = subprocess.Popen(command, cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    deadline = time.time() + 120
    engine_pid = None
    heap_said = False  # a CPU engine process reports its heap policy (kvbench.cpu.cpu_heap)
    while time.time() < deadline:
        line = process.stderr.readline()
        found = re.search(r"engine process (\d+)", line)
        if found:
            engine_pid = int(found.group(1))
        heap_said = heap_said or line.startswith("CPU heap: ")
        match = re.search(r"serving on (http://\S+)", line)
        if match:
            assert engine_pid is not None, "the server did not say which process runs its engine"
            assert heap_said, "the server did not say what its CPU engine's heap keeps"
            return process, match.group(1), engine_pid
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError(f"kvbench serve did not start: {process.stderr.read()}")


@contextmanager
def serving(*extra: str) -> Iterator[str]:
    """``kvbench serve`` as :func:`start_serve` starts it, its URL for the block, stopped (and waited for) after."""
    process, url, _ = start_serve(*extra, stdout=subprocess.DEVNULL)
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def write_shared_prefix_requests(
    path: Path, groups: int, per_group: int, prefix_len: int, tail_len: int, output_len: int, vocab: int = 450
) -> Path:
    """A requests file (``prompt_token_ids`` + ``output_len``) of ``groups`` groups sharing a prefix, in group order
    (a group's first request always before its others); ids from 5 up to ``vocab + 5``."""
    with path.open("w") as out:
        for group in range(groups):
            prefix = [(group * 131 + i * 17) % vocab + 5 for i in range(prefix_len)]
            for index in range(per_group):
                tail = [(group * 7 + index * 11 + i) % vocab + 5 for i in range(tail_len)]
                out.write(json.dumps({"prompt_token_ids": prefix + tail, "output_len": output_len}) + "\n")
    return path
