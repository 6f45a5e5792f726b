"""Shared test configuration."""

import os

# Triton's interpreter must be chosen before any kernel is launched; harmless when triton is absent.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
