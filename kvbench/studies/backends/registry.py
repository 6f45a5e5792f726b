"""The sweep backends kvbench knows, and the choice of a run's backends from its options.

A new backend is one module (a class implementing ``base.PointBackend``, a build function and a ``SPEC``)
plus one line in :data:`BACKENDS`. Nothing else names it: the sweep asks the specs what they need and offer.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvbench.engine.load_pattern import Load
from kvbench.engine.request import Request
from kvbench.engine.result import RunResult
from kvbench.errors import KvbenchError
from kvbench.studies.backends import endpoint, simulated, tensor, vllm_offline
from kvbench.studies.backends.base import (
    BackendSetup,
    BackendSpec,
    BuildContext,
    Need,
    Offer,
    OnStep,
    PointBackend,
    checkpoint_dir,
    run_one_after_another,
)
from kvbench.studies.local_model import LoadedModel
from kvbench.studies.run_options import SweepOptions
from kvbench.values import ThreadChoice

BACKENDS: tuple[BackendSpec, ...] = (
    endpoint.SPEC,  # servers over HTTP (--target): provides the run when targets are given
    tensor.SPEC,  # paged, contiguous on this machine
    simulated.SPEC,  # paged, contiguous simulated on a GPU preset
    vllm_offline.SPEC,  # vLLM's offline engine as a reference column
)


def engine_names() -> tuple[str, ...]:
    """Every engine a sweep can run, in registration order."""
    return tuple(dict.fromkeys(engine for spec in BACKENDS for engine in spec.engines))


@dataclass(frozen=True)
class RunBackends:
    """The backends of one run: the provider (model, vocabulary, device, KV budget) and each engine's."""

    provider: BackendSpec
    by_engine: dict[str, BackendSpec]

    def engines_offering(self, offer: Offer) -> list[str]:
        return [engine for engine, spec in self.by_engine.items() if offer in spec.offers]

    @property
    def needs_prompt_tokens(self) -> bool:
        """Whether requests carry real prompt token ids (else lengths only, each told where it ends)."""
        return Need.PROMPT_TOKENS in self.provider.needs

    def notes(self) -> list[str]:
        """What the run's backends say of themselves before the points (a reference column, ...)."""
        return list(dict.fromkeys(spec.note for spec in self.by_engine.values() if spec.note))

    def build(self, context: BuildContext) -> BackendSetup:
        """The provider first, then every other backend with the provider's setup; one backend for all."""
        provider = self.provider.build(context)
        context.provider = provider
        joined: dict[BackendSpec, PointBackend] = {self.provider: provider.backend}
        for spec in self.by_engine.values():
            if spec not in joined:
                joined[spec] = spec.build(context).backend
        routes = {engine: joined[spec] for engine, spec in self.by_engine.items()}
        return BackendSetup(
            RoutedBackend(provider.backend, routes),
            provider.model_name,
            provider.device_name,
            provider.vocab_size,
            provider.budget_source,
        )


def choose_backends(options: SweepOptions) -> RunBackends:
    """Each engine's backend for this run, with every need checked: before any model loads or file is read."""
    simulated_run = options.simulate
    providers = [
        spec for spec in BACKENDS if spec.provides_run and spec.simulated == simulated_run and spec.selected_by(options)
    ]
    if not providers:
        raise AssertionError("BACKENDS holds no provider for this kind of run")
    provider = providers[0]  # the first registered wins: a specific provider goes before the general one
    by_engine: dict[str, BackendSpec] = {}
    for engine in options.engines:
        candidates = [spec for spec in BACKENDS if spec.runs(engine, options)]
        if not candidates:
            raise KvbenchError(f"unknown engine {engine!r}; choose from {', '.join(engine_names())}")
        fitting = [spec for spec in candidates if spec.simulated == simulated_run]
        spec = fitting[0] if fitting else candidates[0]
        check_needs(spec, options)
        by_engine[engine] = spec
    return RunBackends(provider, by_engine)


def check_needs(spec: BackendSpec, options: SweepOptions) -> None:
    """A backend's needs against the options, in the order a user fixes them: where it runs, what is installed,
    what the model is; then the backend's own pre-flight."""
    if spec.simulated != options.simulate:
        if options.simulate:
            what = " runs a real model on this machine; it" if Need.LOCAL_MODEL in spec.needs else ""
            raise KvbenchError(f"{spec.title}{what} cannot be simulated")
        raise KvbenchError(f"{spec.title} runs only in a simulation")
    if Need.PACKAGE in spec.needs and spec.package and not _installed(spec.package):
        raise KvbenchError(spec.install_hint or f"{spec.title} needs the package {spec.package}: install it")
    if Need.CHECKPOINT_DIR in spec.needs:
        checkpoint_dir(options.model, spec.title)
    if spec.check is not None:
        spec.check(options)


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ValueError:  # imported already, without a spec (a stand-in): it is there
        return True


class RoutedBackend:
    """The run's backends behind one :class:`PointBackend`: each engine to the backend that runs it; the run's
    model, pool, dtype and threads are the provider's."""

    def __init__(self, provider: PointBackend, routes: dict[str, PointBackend]) -> None:
        self.provider = provider
        self.routes = routes
        self.base = provider.base
        self.bytes_per_token = provider.bytes_per_token

    @property
    def loaded(self) -> LoadedModel | None:
        return self.provider.loaded

    @property
    def dtype_name(self) -> str | None:
        return self.provider.dtype_name

    @property
    def threads(self) -> ThreadChoice | None:
        return self.provider.threads

    @property
    def device_label(self) -> str:
        return self.provider.device_label

    @property
    def stops_at_eos(self) -> bool:
        return self.provider.stops_at_eos

    def backend_for(self, engine: str) -> PointBackend:
        return self.routes.get(engine, self.provider)

    def can_fork(self, engine: str) -> bool:
        return self.backend_for(engine).can_fork(engine)

    def warm_up(self, engine: str, requests: list[Request]) -> None:
        self.backend_for(engine).warm_up(engine, requests)

    def run(self, engine: str, requests: list[Request], load: Load, on_step: OnStep | None) -> tuple[RunResult, dict]:
        return self.backend_for(engine).run(engine, requests, load, on_step)

    @property
    def interleaved_engines(self) -> frozenset[str]:
        """The provider's interleaved engines that the provider runs (an engine routed elsewhere does not)."""
        return frozenset(e for e in self.provider.interleaved_engines if self.backend_for(e) is self.provider)

    def run_together(
        self, runs: Sequence[tuple[str, list[Request]]], concurrency: int, on_step: OnStep | None
    ) -> list[tuple[RunResult, dict]]:
        if all(engine in self.interleaved_engines for engine, _ in runs):
            return self.provider.run_together(runs, concurrency, on_step)
        return run_one_after_another(self, runs, concurrency, on_step)

    def observe_allocations(self, engine: str, observer: Callable[[float], None]) -> None:
        self.backend_for(engine).observe_allocations(engine, observer)

    def close(self) -> None:
        """Every backend is closed once, the provider last (the others may share its model)."""
        others = [backend for backend in dict.fromkeys(self.routes.values()) if backend is not self.provider]
        for backend in [*others, self.provider]:
            backend.close()
