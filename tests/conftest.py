"""Shared test configuration."""

import os

# Triton's interpreter must be chosen before any kernel is launched; harmless when triton is absent.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("KVBENCH_THREADS", "1")  # tiny test shapes: no thread measurement, no hand-offs


import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests: CI (HYPOTHESIS_PROFILE=ci, set by .ci/run) replays the same examples on every run, so a
# green or red result never depends on luck; local runs ("dev", the default) keep exploring new ones.
# A failure found while exploring is kept in the test as an explicit @example.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Test shapes are tiny: threads only add hand-offs, and on 2 busy CI cores each can wait a time slice."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole test session (2 CPUs, 127.0.0.1 only), started by the first test that asks,
    shut down at the end; tests skip cleanly where Ray is missing or cannot start."""
    pytest.importorskip("ray")
    from kvbench.errors import KvbenchError
    from kvbench.studies.fleet.ray_runtime import ray_session

    session = ray_session(None, num_cpus=2)
    try:
        ray = session.__enter__()
    except KvbenchError as err:
        pytest.skip(f"Ray cannot start here: {err}")
    try:
        yield ray
    finally:
        session.__exit__(None, None, None)
