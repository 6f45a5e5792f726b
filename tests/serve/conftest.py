"""Servers the tests start on a free 127.0.0.1 port, and stop: the front end in this process (an event loop
thread of its own), the engine in its own process, as ``kvbench serve`` runs them.

After every test the engine must be idle with every KV block back in the pool (the KV manager's drained check),
and stopping a server runs the check once more. The server's engine loads the tiny preset with the same seed and
thread count as ``tiny_model``, so the tokens it answers equal the in-process engine's.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest

from kvbench.serve.connections import ConnectionLimits
from kvbench.serve.lifecycle import Server, ServerThread
from kvbench.serve.settings import ServeOptions
from kvbench.studies.local_model import load_model

THREADS = 1


@pytest.fixture(scope="session")
def tiny_model():
    return load_model("tiny", device="cpu", seed=0, threads=THREADS)


def tiny_options(
    loaded,
    engine: str = "paged",
    num_blocks: int = 256,
    block_size: int = 16,
    max_len: int = 256,
    admission: str = "queue",
    max_num_seqs: int = 256,
) -> ServeOptions:
    """A server of the tiny preset whose pool holds exactly ``num_blocks`` blocks."""
    kv_bytes = num_blocks * block_size * loaded.shape.bytes_per_token
    return ServeOptions(
        model="tiny",
        engine=engine,
        device="cpu",
        kv_memory_bytes=kv_bytes,
        kv_memory_text=f"{kv_bytes}B",
        block_size=block_size,
        admission=admission,
        max_num_seqs=max_num_seqs,
        max_len=max_len,
        threads=THREADS,
        seed=0,
    )


@contextmanager
def running_server(
    loaded,
    engine: str = "paged",
    num_blocks: int = 256,
    block_size: int = 16,
    max_len: int = 256,
    admission: str = "queue",
    max_num_seqs: int = 256,
    limits: ConnectionLimits = ConnectionLimits(),
):
    options = tiny_options(loaded, engine, num_blocks, block_size, max_len, admission, max_num_seqs)
    server = ServerThread(Server(options, "127.0.0.1", 0, limits=limits)).start()
    try:
        yield server
    finally:
        server.stop(grace_s=5.0)  # raises KVLeak if a block was left behind


def engine_of(server: ServerThread):
    return server.server.engine


def assert_idle_and_drained(server: ServerThread) -> None:
    engine = engine_of(server)
    assert engine.wait_idle(30), "the engine did not go idle"
    engine.check_drained()
    # a handler releases its job after its response ended, on the server's loop: a client that has read the last
    # event can get here first (seen once in CI), so give the handlers time; a job never released still fails
    deadline = time.monotonic() + 30
    while engine.jobs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.jobs, "a handler did not release its job"


@pytest.fixture(scope="module")
def paged_server(tiny_model):
    with running_server(tiny_model) as server:
        yield server


@pytest.fixture()
def server(paged_server):
    """The module's paged server, checked drained after the test."""
    yield paged_server
    assert_idle_and_drained(paged_server)
