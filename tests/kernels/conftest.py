"""Kernel tests run Triton through its interpreter on CPU tensors unless a GPU is present.

``triton.jit`` decides at decoration time whether a kernel is interpreted, so ``TRITON_INTERPRET`` must be
set before ``kvbench.kernels.triton_ops`` is imported; if something imported it earlier without the
interpreter on a machine without a GPU, it is reloaded here.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    _loaded = sys.modules.get("kvbench.kernels.triton_ops")
    if _loaded is not None and not getattr(_loaded, "INTERPRETED", True):
        importlib.reload(_loaded)

sys.path.insert(0, os.path.dirname(__file__))  # for kv_cases, whatever pytest's import mode


@pytest.fixture
def device() -> torch.device:
    """Where kernel tests put their tensors: the GPU when Triton compiles for it, else the CPU."""
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return torch.device("cuda")
    return torch.device("cpu")
