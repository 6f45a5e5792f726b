"""The C kernels' instruction-set variants this CPU can run (``KVBENCH_CPU_ISA``), for tests that run each."""

from __future__ import annotations

import pytest

from kvbench.kernels import cpu_native


def runnable_variants() -> list[str]:
    """Every variant of :data:`cpu_native.ISA_VARIANTS` whose instructions this CPU has."""
    runnable = []
    for name in cpu_native.ISA_VARIANTS:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(cpu_native.ISA_ENV, name)
            try:
                cpu_native._isa_flags()
                runnable.append(name)
            except RuntimeError:
                pass
    return runnable
