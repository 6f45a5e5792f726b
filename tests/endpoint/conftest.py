"""The endpoint tests' fake OpenAI-compatible server is importable as ``fake_server``."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
