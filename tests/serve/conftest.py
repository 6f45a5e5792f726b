"""Servers the tests start on a free 127.0.0.1 port, in this process (their own event loop thread), and stop.

After every test the engine must be idle with every KV block back in the pool (the KV manager's drained check),
and stopping a server runs the check once more.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.measure.metrics import KvMetrics
from kvbench.serve.lifecycle import Server, ServerThread
from kvbench.serve.protocol import ModelInfo
from kvbench.studies.local_model import build_engine, load_model


@pytest.fixture(scope="session")
def tiny_model():
    return load_model("tiny", device="cpu", seed=0)


@contextmanager
def running_server(loaded, name: str = "tiny", engine: str = "paged", num_blocks: int = 256, block_size: int = 16,
                   max_len: int = 256, admission: str = "queue", max_num_seqs: int = 256):
    config = EngineConfig(engine=engine, block_size=block_size, num_blocks=num_blocks, max_len=max_len,
                          admission=admission, max_num_seqs=max_num_seqs)
    info = ModelInfo(name=name, max_len=max_len, vocab_size=loaded.shape.vocab_size, tokenizer=loaded.tokenizer,
                     parallel_sampling=engine == "paged")
    server = ServerThread(Server(build_engine(loaded, config), info, KvMetrics("cpu"), "127.0.0.1", 0)).start()
    try:
        yield server
    finally:
        server.stop(grace_s=5.0)  # raises KVLeak if a block was left behind


def assert_idle_and_drained(server: ServerThread) -> None:
    engine_loop = server.server.engine_loop
    assert engine_loop.wait_idle(30), "the engine did not go idle"
    engine_loop.check_drained()
    assert not engine_loop.jobs


@pytest.fixture(scope="module")
def paged_server(tiny_model):
    with running_server(tiny_model) as server:
        yield server


@pytest.fixture()
def server(paged_server):
    """The module's paged server, checked drained after the test."""
    yield paged_server
    assert_idle_and_drained(paged_server)
