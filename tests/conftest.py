"""Shared test configuration."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # shared helpers (gguf_fixture), whatever pytest's import mode

# Triton's interpreter must be chosen before any kernel is launched; harmless when triton is absent.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


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
def tiny_gguf(tmp_path_factory):
    """(path, source model) of a tiny random Llama written as a GGUF file with a tokenizer; skipped without the
    optional packages (``pip install 'kvbench[gguf]'``)."""
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    from gguf_fixture import write_tiny_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_tiny_gguf(path, seed=3)
