"""A sweep's settings resolved once: the scenario, the request list, the KV budget and the backend.

:class:`SweepOptions` (``run_options``) is what the user asked for; :meth:`SweepSetup.resolve` turns it into
everything a
sweep needs, and the setup writes both records a run directory keeps: the pinned configuration (what a
resume must match) and the run metadata of ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request
from kvbench.errors import KvbenchError
from kvbench.fileio import content_sha256
from kvbench.kv.block_pool import blocks_for
from kvbench.kv.factory import manager_class
from kvbench.models.gguf_file import gguf_fingerprint, is_gguf
from kvbench.preflight import check_concurrency, check_requests_for_host, check_run_counts
from kvbench.results.run_meta import run_meta
from kvbench.studies.backends.base import BuildContext, Offer, PointBackend
from kvbench.studies.backends.registry import RunBackends, choose_backends
from kvbench.studies.run_options import SweepOptions
from kvbench.studies.run_requests import (
    RequestChoice,
    Workload,
    check_stop,
    default_stop,
    resolve_requests,
    server_stop_text,
    sized_workload,
    stop_reason_text,
)
from kvbench.studies.sweep import SweepPlan
from kvbench.workload.admissible import Skipped
from kvbench.workload.scenario import Scenario, load_scenario


@dataclass
class SweepSetup:
    options: SweepOptions
    spec: Scenario
    seed: int
    levels: tuple[int, ...]
    workload: Workload  # prompts, reference lengths and the stop mode
    counts: dict[int, int]  # requests per point, by concurrency (a prefix of the workload's list)
    skipped: Skipped | None
    backend: PointBackend
    backends: RunBackends  # which backend runs each engine, and what each offers
    config: EngineConfig
    model_name: str
    device_name: str
    vocab_size: int
    budget_source: str
    warm_pairs: list[tuple[int, int]] = field(default_factory=list)
    stop_text: str = ""

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return self.workload.pairs

    @classmethod
    def resolve(cls, options: SweepOptions, status: Callable[[str], Any] | None = None) -> SweepSetup:
        """Everything the sweep needs, checked before any point runs."""
        backends = choose_backends(options)  # installed, simulated or not, a checkpoint: before any model loads
        spec = load_scenario(options.scenario)
        seed = spec.seed if options.seed is None else options.seed
        levels = options.concurrency or spec.concurrency
        if options.endpoint is not None and options.endpoint.rates is not None:
            levels = (1,)  # an open loop's levels are rates: one request list for all, the scenario's length
        block_size = options.block_size or spec.block_size
        check_concurrency(dict.fromkeys(levels))  # a level past any request count, before the counts it implies
        counts = {c: options.requests or spec.requests_for(c) for c in levels}
        check_run_counts(requests=max(counts.values()), block_size=block_size, samples=spec.samples)
        stop = options.stop or default_stop(options.model, options.simulate)
        reserve = options.reserve or spec.reserve
        check_stop(stop, reserve)
        if spec.samples > 1 and options.simulate:
            raise KvbenchError(
                f"scenario {spec.name} samples {spec.samples} per request: parallel sampling runs on "
                "the tensor engine only, not in simulation"
            )
        endpoint = options.endpoint
        if endpoint is not None and endpoint.max_len is not None:  # a server's context, not the scenario's
            spec = replace(
                spec,
                lengths=replace(
                    spec.lengths, max_len=endpoint.max_len, mean_len=min(spec.lengths.mean_len, endpoint.max_len)
                ),
            )
        max_len = spec.lengths.max_len
        choice = RequestChoice(requests_file=options.requests_file, dataset=options.dataset)
        workload, tokenizer = resolve_requests(choice, spec, options.model, max(counts.values()), seed, stop, status)
        if endpoint is not None and (endpoint.input_len is not None or endpoint.output_len is not None):
            workload = sized_workload(workload, endpoint.input_len, endpoint.output_len, seed)
        if options.requests_file is not None:  # a requests file is replayed exactly, at every point
            counts = dict.fromkeys(levels, len(workload.pairs))
        else:
            counts = {c: min(n, len(workload.pairs)) for c, n in counts.items()}
        check_concurrency(counts)
        if backends.needs_prompt_tokens:  # token lists in memory, and answers up to max-len when they stop at EOS
            pairs = workload.pairs
            outputs = [o if stop == "length" else max_len - p for p, o in pairs]
            check_requests_for_host(len(pairs), sum(p for p, _ in pairs), sum(outputs))
        warm = [(min(p, 8), min(o, 4)) for p, o in spec.lengths.sample(spec.warmup, seed + 1)] if spec.warmup else []
        base = EngineConfig(
            block_size=block_size,
            reserve=reserve,
            admission=options.admission or spec.admission,
            max_num_seqs=max(256, *levels),  # the batch cap must not lower the concurrency asked for
            max_len=max_len,
        )
        built = backends.build(BuildContext(options, base, spec, seed, status, tokenizer))
        backend = built.backend
        if stop == "eos" and not backend.stops_at_eos:
            raise KvbenchError(
                f"stopping at EOS needs a model that has an EOS token; {built.model_name} has none "
                "(random-weight presets never end an answer): use the length stop mode"
            )
        check_pool_holds_a_request(
            backend.base,
            backends.engines_offering(Offer.KV_MANAGER),
            workload.pairs[: max(counts.values())],
            stop,
            backend.bytes_per_token,
            built.budget_source,
        )
        workload.check_vocabulary(built.vocab_size)
        text = (
            server_stop_text(stop)
            if endpoint is not None
            else stop_reason_text(stop, options.model, options.simulate, options.stop is not None)
        )
        return cls(
            options=options,
            spec=spec,
            seed=seed,
            levels=tuple(levels),
            workload=workload,
            counts=counts,
            skipped=workload.skipped,
            backend=backend,
            backends=backends,
            config=backend.base,
            model_name=built.model_name,
            device_name=built.device_name,
            vocab_size=built.vocab_size,
            budget_source=built.budget_source,
            warm_pairs=warm,
            stop_text=text,
        )

    # -- the plan ---------------------------------------------------------------------------------------
    def plan(self, continue_on_error: bool) -> SweepPlan:
        return SweepPlan(
            self.options.engines,
            self.levels,
            self.spec.name,
            self.make_requests,
            self._warm_maker(),
            self.options.repeat,
            continue_on_error,
            self.spec.samples,
        )

    def make_requests(self, concurrency: int | None = None) -> list[Request]:
        """A fresh, identical request list for a point at ``concurrency`` (each run mutates its requests)."""
        count = self.counts.get(concurrency, len(self.workload.pairs)) if concurrency else len(self.workload.pairs)
        return self.workload.requests(count, self.vocab_size, self.seed, not self.backends.needs_prompt_tokens)

    def _warm_maker(self) -> Callable[[], list[Request]]:
        warm = Workload(self.warm_pairs, None, "length", self.config.max_len)  # short, EOS ignored: just warming up
        return lambda: warm.requests(
            len(self.warm_pairs), self.vocab_size, self.seed, not self.backends.needs_prompt_tokens
        )

    # -- what a run directory records -------------------------------------------------------------------
    @property
    def pool_slots(self) -> int | None:
        """The KV pool's token slots; None where the backend sizes none (a server over HTTP has its own)."""
        return None if Offer.OWN_POINTS in self.backends.provider.offers else self.config.pool_slots

    def pinned_config(self) -> dict[str, Any]:
        """What a resume must match. Contents, not names: an edited scenario or requests file must not mix
        with earlier points. Request lists are prefixes of one seeded list, so a resume may add levels."""
        options, config = self.options, self.config
        return {
            "scenario": self.spec.name,
            "model": self.model_name,
            "simulated": options.simulate,
            "requests": options.requests or self.spec.requests,
            "seed": self.seed,
            "block_size": config.block_size,
            "waves": 0 if options.requests else self.spec.waves,
            "stop": self.workload.stop,
            "dataset_sha256": content_sha256(self.workload.dataset.path) if self.workload.dataset else None,
            "kv_pool_slots": self.pool_slots,
            "reserve": config.reserve,
            "admission": config.admission,
            "max_len": config.max_len,
            "repeat": options.repeat,
            "requests_file": str(options.requests_file) if options.requests_file else None,
            "samples": self.spec.samples,
            "dtype": self.backend.dtype_name,
            "scenario_sha256": content_sha256(Path(self.spec.source)) if self.spec.source else None,
            "requests_file_sha256": content_sha256(options.requests_file) if options.requests_file else None,
            "model_config_sha256": _model_config_hash(options.model),
            "gpu": options.gpu if options.simulate else None,
        }

    def meta(self) -> dict[str, Any]:
        """The run metadata of ``summary.json``."""
        config = self.config
        return run_meta(
            scenario=self.spec.name,
            scenario_description=self.spec.description,
            scenario_source=self.spec.source,
            model_name=self.model_name,
            device=self.device_name,
            simulated=self.options.simulate,
            seed=self.seed,
            requests=len(self.pairs),
            concurrency=list(self.levels),
            engines=list(self.options.engines),
            model_shape=_shape_of(self.backend),
            block_size=config.block_size,
            kv_pool_slots=self.pool_slots,
            budget_source=self.budget_source,
            reserve=config.reserve,
            admission=config.admission,
            max_len=config.max_len,
            max_prefill_tokens=config.max_prefill_tokens,
            repeat=self.options.repeat,
            threads=threads.as_dict() if (threads := self.backend.threads) else None,
            cpu_matmuls=plan.as_dict() if (loaded := self.backend.loaded) and (plan := loaded.matmul_plan) else None,
            cpu_decode_prefetch=(
                prefetch.as_dict() if (loaded := self.backend.loaded) and (prefetch := loaded.decode_prefetch) else None
            ),
            skipped_requests=self.skipped.as_dict() if self.skipped else None,
            requests_per_point={str(c): n for c, n in self.counts.items()},
            stop=self.workload.stop,
            stop_description=self.stop_text,
            dataset=self.workload.dataset.as_dict() if self.workload.dataset else None,
        )


def _shape_of(backend) -> dict[str, Any] | None:
    """The model's shape (layers, heads, dtype, bytes per token) for the run's provenance."""
    shape = getattr(backend, "shape", None) or getattr(getattr(backend, "loaded", None), "shape", None)
    return shape.to_dict() if shape is not None else None


def check_pool_holds_a_request(
    config: EngineConfig,
    engines: Sequence[str],
    pairs: Sequence[tuple[int, int]],
    stop: str,
    bytes_per_token: int,
    source: str,
) -> None:
    """Refuse, before any point runs, a KV pool that cannot hold the run's longest request even when empty.

    The contiguous baseline needs that request's reservation (max-len under ``reserve max``), the paged engine
    the blocks of its planned length (max-len - 1 when answers stop at EOS: the engines plan for max_tokens).
    Such a request is rejected at every point: a sweep that serves none, or a part, is no measurement.
    """
    if not pairs:
        return
    longest = max(p + (o if stop == "length" else config.max_len - p) - 1 for p, o in pairs)  # KV slots written
    for engine in engines:
        manager = manager_class(engine)
        tokens = manager.slots_for(longest, config.reserve, config.max_len)
        if manager.reserves_up_front:
            what = (
                f"the {engine} baseline reserves {tokens:,} token slots for its longest request (reserve "
                f"{config.reserve}{', that is max-len' if config.reserve == 'max' else ''})"
            )
        else:
            what = f"the {engine} engine needs {tokens:,} token slots for its longest request"
        need = blocks_for(tokens, config.block_size)
        if need > config.num_blocks:
            size, unit = -(-need * config.block_size * bytes_per_token // 1024), "KiB"  # rounded up: enough
            for bigger in ("MiB", "GiB"):
                if size % 1024 == 0:
                    size, unit = size // 1024, bigger
            slots = f"{config.pool_slots:,} token slots"
            where = source.removeprefix(f"{slots} = ")  # the simulator's source starts with its slots
            reservation_bound = manager.reserves_up_front and config.reserve == "max"
            other = "another reservation policy (pow2, oracle)" if reservation_bound else "shorter requests"
            raise KvbenchError(
                f"{what}, but the KV pool holds {slots} ({where}): that request could never "
                f"run; give the pool at least {size}{unit} of KV memory, or use {other}"
            )


def _model_config_hash(model: str) -> str | None:
    """The content hash of a local model's config.json or GGUF header (a preset's shape is fixed by its name)."""
    path = Path(model)
    if is_gguf(path):
        return gguf_fingerprint(path)
    config = path / "config.json" if path.is_dir() else path
    return content_sha256(config) if config.is_file() else None
