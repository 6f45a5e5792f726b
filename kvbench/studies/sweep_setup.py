"""A sweep's settings resolved once: the scenario, the request list, the KV budget and the backend.

:class:`SweepOptions` is what the user asked for; :meth:`SweepSetup.resolve` turns it into everything a
sweep needs, and the setup writes both records a run directory keeps: the pinned configuration (what a
resume must match) and the run metadata of ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, make_request
from kvbench.errors import KvbenchError
from kvbench.fileio import content_sha256
from kvbench.preflight import check_requests_for_host, check_run_counts
from kvbench.report.rundir import run_meta
from kvbench.studies.backends import PointBackend
from kvbench.studies.sweep import SweepPlan
from kvbench.studies.vllm_backend import VLLM_ENGINE, check_vllm, with_vllm
from kvbench.workload.admissible import Skipped, within_max_len
from kvbench.workload.scenario import Scenario, load_scenario

SIMULATED_STAND_IN = "llama-2-13b"  # the tiny CPU model is simulated as the article's model


@dataclass(frozen=True)
class SweepOptions:
    """A sweep as asked for; None means "the scenario's"."""

    scenario: str = "article"
    concurrency: tuple[int, ...] | None = None
    engines: tuple[str, ...] = ("paged", "contiguous")
    model: str = "tiny"
    device: str = "auto"
    dtype: str | None = None
    kv_memory_bytes: int | None = None
    kv_memory_text: str | None = None  # as typed, for the budget's description
    utilization: float | None = None
    block_size: int | None = None
    reserve: str | None = None
    admission: str | None = None
    requests: int | None = None
    requests_file: Path | None = None
    repeat: int = 1
    seed: int | None = None
    simulate: bool = False
    gpu: str = "a100-80g"
    threads: int | None = None  # CPU intra-op threads; None: measured (kvbench.models.threads)


@dataclass
class SweepSetup:
    options: SweepOptions
    spec: Scenario
    seed: int
    levels: tuple[int, ...]
    pairs: list[tuple[int, int]]  # (prompt, output) lengths of the measured requests
    replay: list[tuple[list[int], int]] | None  # exact prompts and output lengths from a requests file
    skipped: Skipped | None
    backend: PointBackend
    config: EngineConfig
    model_name: str
    device_name: str
    vocab_size: int
    budget_source: str
    warm_pairs: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def resolve(cls, options: SweepOptions, status: Callable[[str], Any] | None = None) -> SweepSetup:
        """Everything the sweep needs, checked before any point runs."""
        if VLLM_ENGINE in options.engines:
            check_vllm(options)  # installed, not simulated, a checkpoint directory: before any model loads
        spec = load_scenario(options.scenario)
        seed = spec.seed if options.seed is None else options.seed
        levels = options.concurrency or spec.concurrency
        block_size = options.block_size or spec.block_size
        count = options.requests or spec.requests
        check_run_counts(requests=count, block_size=block_size, samples=spec.samples)
        replay, skipped = None, None
        if options.requests_file is not None:  # replay exact prompts (token ids) and output lengths
            from kvbench.workload.requests_file import load_requests_jsonl

            replay = load_requests_jsonl(options.requests_file)
            kept, skipped = within_max_len([(len(ids), out) for ids, out in replay], spec.lengths.max_len,
                                           f"records of {options.requests_file}")
            replay = [replay[index] for index in kept]
            pairs = [(len(ids), out) for ids, out in replay]
        else:
            pairs = spec.lengths.sample(count, seed)
        if not options.simulate:
            check_requests_for_host(len(pairs), sum(p for p, _ in pairs), sum(o for _, o in pairs))
        if spec.samples > 1 and options.simulate:
            raise KvbenchError(f"scenario {spec.name} samples {spec.samples} per request: parallel sampling runs on "
                               "the tensor engine only, not in simulation")
        warm = [(min(p, 8), min(o, 4)) for p, o in spec.lengths.sample(spec.warmup, seed + 1)] if spec.warmup else []
        base = EngineConfig(block_size=block_size, reserve=options.reserve or spec.reserve,
                            admission=options.admission or spec.admission,
                            max_num_seqs=max(256, *levels),  # the batch cap must not lower the concurrency asked for
                            max_len=spec.lengths.max_len)
        if options.simulate:
            from kvbench.studies.backends import simulated_backend

            backend, model_name, device_name, vocab, source = simulated_backend(options, base)
        else:
            from kvbench.studies.backends import tensor_backend

            backend, model_name, device_name, vocab, source = tensor_backend(options, base, spec, seed,
                                                                             len(options.engines), status)
            if VLLM_ENGINE in options.engines:  # vLLM's offline engine as a reference column
                backend = with_vllm(backend, options, seed)
        if replay is not None and any(token >= vocab for ids, _ in replay for token in ids):
            raise KvbenchError(f"{options.requests_file}: a prompt token id is outside the model's vocabulary "
                               f"of {vocab}")
        return cls(options, spec, seed, tuple(levels), pairs, replay, skipped, backend, backend.base, model_name,
                   device_name, vocab, source, warm)

    # -- the plan ---------------------------------------------------------------------------------------
    def plan(self, continue_on_error: bool) -> SweepPlan:
        return SweepPlan(self.options.engines, self.levels, self.spec.name, self.make_requests,
                         self._maker(self.warm_pairs), self.options.repeat, continue_on_error, self.spec.samples)

    def make_requests(self) -> list[Request]:
        """A fresh, identical request list (each run mutates its requests)."""
        if self.replay is not None and not self.options.simulate:
            from kvbench.engine.sampling import SamplingParams

            return [make_request(i, ids, SamplingParams(max_tokens=out, ignore_eos=True))
                    for i, (ids, out) in enumerate(self.replay)]
        return self._maker(self.pairs)()

    def _maker(self, pairs: list[tuple[int, int]]) -> Callable[[], list[Request]]:
        if self.options.simulate:
            return lambda: [Request(i, p, o) for i, (p, o) in enumerate(pairs)]
        from kvbench.studies.backends import token_requests

        return lambda: token_requests(pairs, self.vocab_size, self.seed)

    # -- what a run directory records -------------------------------------------------------------------
    def pinned_config(self) -> dict[str, Any]:
        """What a resume must match. Contents, not names: an edited scenario or requests file must not mix
        with earlier points."""
        options, config = self.options, self.config
        return {
            "scenario": self.spec.name, "model": self.model_name, "simulated": options.simulate,
            "requests": len(self.pairs), "seed": self.seed, "block_size": config.block_size,
            "kv_pool_slots": config.pool_slots, "reserve": config.reserve, "admission": config.admission,
            "max_len": config.max_len, "repeat": options.repeat,
            "requests_file": str(options.requests_file) if options.requests_file else None,
            "samples": self.spec.samples, "dtype": getattr(self.backend, "dtype_name", None),
            "scenario_sha256": content_sha256(Path(self.spec.source)) if self.spec.source else None,
            "requests_file_sha256": content_sha256(options.requests_file) if options.requests_file else None,
            "model_config_sha256": _model_config_hash(options.model),
            "gpu": options.gpu if options.simulate else None,
        }

    def meta(self) -> dict[str, Any]:
        """The run metadata of ``summary.json``."""
        config = self.config
        return run_meta(
            scenario=self.spec.name, scenario_description=self.spec.description, scenario_source=self.spec.source,
            model_name=self.model_name, device=self.device_name, simulated=self.options.simulate, seed=self.seed,
            requests=len(self.pairs), concurrency=list(self.levels), engines=list(self.options.engines),
            block_size=config.block_size, kv_pool_slots=config.pool_slots, budget_source=self.budget_source,
            reserve=config.reserve, admission=config.admission, max_len=config.max_len,
            max_prefill_tokens=config.max_prefill_tokens, repeat=self.options.repeat,
            threads=getattr(self.backend, "threads", None),
            skipped_requests=self.skipped.as_dict() if self.skipped else None,
        )


def _model_config_hash(model: str) -> str | None:
    """The content hash of a local model's config.json (a preset's shape is fixed by its name)."""
    path = Path(model)
    config = path / "config.json" if path.is_dir() else path
    return content_sha256(config) if config.is_file() else None
