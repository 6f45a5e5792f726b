"""What a sweep backend is: the interface a point runs through, and the declaration a backend registers.

A backend runs one or more of a sweep's engines (its columns). It declares what it needs from the run
(:class:`Need`) and what it offers (:class:`Offer`); the generic code asks those declarations, never a
backend's name. One backend of a run *provides* it (``BackendSpec.provides_run``): it resolves the model,
the vocabulary, the device and the KV budget every engine of the run shares; the others join it (vLLM takes
the provider's model and pool size).

A point is run as ``backend.run(engine, requests, load, on_step)``: ``load`` is the pattern (closed loop, open
loop: ``kvbench.engine.load_pattern``), the backend only the transport that carries it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kvbench.engine.config import EngineConfig
from kvbench.engine.load_pattern import ClosedLoop, Load
from kvbench.engine.request import Request
from kvbench.engine.result import RunResult
from kvbench.errors import KvbenchError
from kvbench.studies.local_model import LoadedModel
from kvbench.studies.run_options import SweepOptions
from kvbench.values import ThreadChoice
from kvbench.workload.scenario import Scenario

OnStep = Callable[[str, Any, int], None]  # (engine, its scheduler or None, requests finished so far)


class Need(enum.Enum):
    """What a backend needs from the run; the registry checks each before anything loads."""

    LOCAL_MODEL = "a model loaded on this machine (a preset or a checkpoint)"
    CHECKPOINT_DIR = "a local checkpoint directory as the model"
    PROMPT_TOKENS = "real prompt token ids (the model decides where an answer ends)"
    GPU_PRESET = "a GPU preset whose roofline times the steps"
    PACKAGE = "an installed package of its own (BackendSpec.package)"


class Offer(enum.Enum):
    """What a backend's points offer; the sweep asks these, never a backend's name."""

    KV_MANAGER = "kvbench's KV managers over a pool kvbench sizes: exact waste accounting, the pool pre-flight"
    LIVE_KV = "live scheduler and pool state at every step: Prometheus metrics"
    MEMORY_PEAKS = "device memory peaks of each point (the waterfall)"
    DETERMINISTIC = "the same requests always give the same schedule and figures"
    REFERENCE_ONLY = "a reference column: its own kernels and scheduler, not a controlled A/B"
    OWN_POINTS = "it measures its points itself (a server over HTTP: client figures and the server's /metrics)"


class PointBackend(Protocol):
    """Runs a sweep's points for the engines it serves, on a fresh copy of the request list each time."""

    base: EngineConfig  # the run's engine configuration, its pool sized
    bytes_per_token: int

    @property
    def loaded(self) -> LoadedModel | None:
        """The model loaded on this machine; None where none is (the simulator, a remote server)."""
        ...

    @property
    def dtype_name(self) -> str | None: ...

    @property
    def threads(self) -> ThreadChoice | None:
        """The CPU thread choice of a local model; None elsewhere."""
        ...

    @property
    def device_label(self) -> str:
        """The ``device`` label of live metrics."""
        ...

    @property
    def stops_at_eos(self) -> bool:
        """Whether answers can end at EOS here: a model with an EOS token, or told each end in advance."""
        ...

    def can_fork(self, engine: str) -> bool:
        """Whether ``engine`` serves parallel samples by forking one request (else n copies are sent)."""
        ...

    def warm_up(self, engine: str, requests: list[Request]) -> None: ...

    def run(self, engine: str, requests: list[Request], load: Load, on_step: OnStep | None) -> tuple[RunResult, dict]:
        """The run and its memory peaks (results-schema ``memory`` names; empty where none are measured)."""
        ...

    @property
    def interleaved_engines(self) -> frozenset[str]:
        """The engines whose points at one concurrency :meth:`run_together` steps in turn (empty: none)."""
        ...

    def run_together(
        self, runs: Sequence[tuple[str, list[Request]]], concurrency: int, on_step: OnStep | None
    ) -> list[tuple[RunResult, dict]]:
        """Each engine's run at ``concurrency`` closed-loop, stepped in turn where the engines interleave (a
        shared machine's load then falls on each alike); one ``run`` result per engine, in order."""
        ...

    def observe_allocations(self, engine: str, observer: Callable[[float], None]) -> None:
        """Time every KV block allocation of ``engine`` (backends offering ``LIVE_KV``)."""
        ...

    def close(self) -> None:
        """Let go of what the backend holds (processes, memory); called once, however the run ends."""
        ...


@dataclass
class BackendSetup:
    """A provider's answer: the backend and what the run reports about its model, device and KV budget."""

    backend: PointBackend
    model_name: str
    device_name: str
    vocab_size: int
    budget_source: str


@dataclass
class BuildContext:
    """What a backend is built from: the sweep's options and everything resolved before it."""

    options: SweepOptions
    base: EngineConfig  # the pool not sized yet (a provider sizes it)
    scenario: Scenario
    seed: int
    status: Callable[[str], Any] | None = None  # progress lines while loading
    tokenizer: Any = None  # already loaded to count a dataset (handed on to the model loader)
    provider: BackendSetup | None = None  # for a backend that joins the run: the provider's setup
    server: bool = False  # a server's pool: on a CPU without a size, a share of this machine's memory


@dataclass(frozen=True)
class BackendSpec:
    """One registered backend (see ``registry.BACKENDS``)."""

    name: str
    engines: tuple[str, ...]  # the sweep columns it runs (fixed; see engines_of for those the user names)
    title: str  # how messages name it ("the vLLM column")
    needs: frozenset[Need]
    offers: frozenset[Offer]
    build: Callable[[BuildContext], BackendSetup]
    simulated: bool = False  # it runs under a simulation (else on real hardware)
    provides_run: bool = False  # it resolves the run's model, vocabulary, device and KV budget
    # a provider: whether it provides a run with these options (the first in BACKENDS that does, among those of
    # the run's kind, simulated or not); e.g. an endpoint target's provider, when a target URL is given
    selected_by: Callable[[SweepOptions], bool] = lambda options: True
    package: str | None = None  # the package ``Need.PACKAGE`` names
    install_hint: str = ""  # how to install that package, in one line
    check: Callable[[SweepOptions], None] | None = None  # its own pre-flight, after the checks of its needs
    note: str | None = None  # said before the points when it runs (a reference column says what it is)
    # engines named by the run's options rather than fixed (the targets of an endpoint sweep, by their names)
    engines_of: Callable[[SweepOptions], tuple[str, ...]] = lambda options: ()

    def runs(self, engine: str, options: SweepOptions) -> bool:
        """Whether this backend runs ``engine`` in a run with ``options``."""
        return engine in self.engines or engine in self.engines_of(options)


def checkpoint_dir(model: str, title: str) -> Path:
    """``model`` as a local checkpoint directory (a ``config.json`` in it), or a one-line error naming ``title``."""
    path = Path(model)
    if not (path.is_dir() and (path / "config.json").is_file()):
        raise KvbenchError(
            f"{title} needs a local checkpoint directory as the model; {model!r} is not one "
            "(a preset's random weights exist only inside kvbench)"
        )
    return path


def run_one_after_another(
    backend: PointBackend, runs: Sequence[tuple[str, list[Request]]], concurrency: int, on_step: OnStep | None
) -> list[tuple[RunResult, dict]]:
    """``run_together`` of a backend whose engines do not interleave: each run alone, in order."""
    return [backend.run(engine, requests, ClosedLoop(concurrency), on_step) for engine, requests in runs]
