"""A sweep's settings resolved once: the scenario, the request list, the KV budget and the backend.

:class:`SweepOptions` is what the user asked for; :meth:`SweepSetup.resolve` turns it into everything a
sweep needs, and the setup writes both records a run directory keeps: the pinned configuration (what a
resume must match) and the run metadata of ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request
from kvbench.errors import KvbenchError
from kvbench.fileio import content_sha256
from kvbench.preflight import check_requests_for_host, check_run_counts
from kvbench.report.rundir import run_meta
from kvbench.studies.backends import PointBackend
from kvbench.studies.sweep import SweepPlan
from kvbench.studies.vllm_backend import VLLM_ENGINE, check_vllm, own_engines, with_vllm
from kvbench.studies.workload import Workload, check_stop, dataset_workload, default_stop, stop_reason_text
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
    dataset: str | None = None  # a dataset file or shipped name (default: the scenario's, if any)
    stop: str | None = None  # eos | length (default: eos for a real model with a tokenizer)
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
    workload: Workload  # prompts, reference lengths and the stop mode
    counts: dict[int, int]  # requests per point, by concurrency (a prefix of the workload's list)
    skipped: Skipped | None
    backend: PointBackend
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
        if VLLM_ENGINE in options.engines:
            check_vllm(options)  # installed, not simulated, a checkpoint directory: before any model loads
        spec = load_scenario(options.scenario)
        seed = spec.seed if options.seed is None else options.seed
        levels = options.concurrency or spec.concurrency
        block_size = options.block_size or spec.block_size
        counts = {c: options.requests or spec.requests_for(c) for c in levels}
        check_run_counts(requests=max(counts.values()), block_size=block_size, samples=spec.samples)
        stop = options.stop or default_stop(options.model, options.simulate)
        reserve = options.reserve or spec.reserve
        check_stop(stop, reserve)
        if spec.samples > 1 and options.simulate:
            raise KvbenchError(f"scenario {spec.name} samples {spec.samples} per request: parallel sampling runs on "
                               "the tensor engine only, not in simulation")
        max_len = spec.lengths.max_len
        workload, skipped, tokenizer = _workload(options, spec, seed, max(counts.values()), stop, status)
        if options.requests_file is not None:  # a requests file is replayed exactly, at every point
            counts = dict.fromkeys(levels, len(workload.pairs))
        else:
            counts = {c: min(n, len(workload.pairs)) for c, n in counts.items()}
        if not options.simulate:
            pairs = workload.pairs
            outputs = [o if stop == "length" else max_len - p for p, o in pairs]
            check_requests_for_host(len(pairs), sum(p for p, _ in pairs), sum(outputs))
        warm = [(min(p, 8), min(o, 4)) for p, o in spec.lengths.sample(spec.warmup, seed + 1)] if spec.warmup else []
        base = EngineConfig(block_size=block_size, reserve=reserve, admission=options.admission or spec.admission,
                            max_num_seqs=max(256, *levels),  # the batch cap must not lower the concurrency asked for
                            max_len=max_len)
        if options.simulate:
            from kvbench.studies.backends import simulated_backend

            backend, model_name, device_name, vocab, source = simulated_backend(options, base)
        else:
            from kvbench.studies.backends import tensor_backend

            load = {"tokenizer": tokenizer} if tokenizer is not None else {}
            backend, model_name, device_name, vocab, source = tensor_backend(options, base, spec, seed,
                                                                             len(options.engines), status, **load)
            if stop == "eos" and not backend.loaded.stop_token_ids:
                raise KvbenchError(f"stopping at EOS needs a model that has an EOS token; {model_name} has none "
                                   "(random-weight presets never end an answer): use the length stop mode")
            if VLLM_ENGINE in options.engines:  # vLLM's offline engine as a reference column
                backend = with_vllm(backend, options, seed)
        check_pool_holds_a_request(backend.base, own_engines(options.engines), workload.pairs[:max(counts.values())],
                                   stop, backend.bytes_per_token, source)
        ids = workload.prompt_ids
        if ids is not None and any(token >= vocab for prompt in ids for token in prompt):
            where = options.requests_file or workload.dataset.path
            raise KvbenchError(f"{where}: a prompt token id is outside the model's vocabulary of {vocab}")
        text = stop_reason_text(stop, options.model, options.simulate, options.stop is not None)
        return cls(options, spec, seed, tuple(levels), workload, counts, skipped, backend, backend.base, model_name,
                   device_name, vocab, source, warm, text)

    # -- the plan ---------------------------------------------------------------------------------------
    def plan(self, continue_on_error: bool) -> SweepPlan:
        return SweepPlan(self.options.engines, self.levels, self.spec.name, self.make_requests,
                         self._warm_maker(), self.options.repeat, continue_on_error, self.spec.samples)

    def make_requests(self, concurrency: int | None = None) -> list[Request]:
        """A fresh, identical request list for a point at ``concurrency`` (each run mutates its requests)."""
        count = self.counts.get(concurrency, len(self.workload.pairs)) if concurrency else len(self.workload.pairs)
        return self.workload.requests(count, self.vocab_size, self.seed, self.options.simulate)

    def _warm_maker(self) -> Callable[[], list[Request]]:
        warm = Workload(self.warm_pairs, None, "length", self.config.max_len)  # short, EOS ignored: just warming up
        return lambda: warm.requests(len(self.warm_pairs), self.vocab_size, self.seed, self.options.simulate)

    # -- what a run directory records -------------------------------------------------------------------
    def pinned_config(self) -> dict[str, Any]:
        """What a resume must match. Contents, not names: an edited scenario or requests file must not mix
        with earlier points. Request lists are prefixes of one seeded list, so a resume may add levels."""
        options, config = self.options, self.config
        return {
            "scenario": self.spec.name, "model": self.model_name, "simulated": options.simulate,
            "requests": options.requests or self.spec.requests, "seed": self.seed, "block_size": config.block_size,
            "waves": 0 if options.requests else self.spec.waves, "stop": self.workload.stop,
            "dataset_sha256": content_sha256(self.workload.dataset.path) if self.workload.dataset else None,
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
            cpu_matmuls=plan.as_dict() if (plan := getattr(self.backend, "matmul_plan", None)) else None,
            skipped_requests=self.skipped.as_dict() if self.skipped else None,
            requests_per_point={str(c): n for c, n in self.counts.items()}, stop=self.workload.stop,
            stop_description=self.stop_text,
            dataset=self.workload.dataset.as_dict() if self.workload.dataset else None,
        )


def check_pool_holds_a_request(config: EngineConfig, engines: Sequence[str], pairs: Sequence[tuple[int, int]],
                               stop: str, bytes_per_token: int, source: str) -> None:
    """Refuse, before any point runs, a KV pool that cannot hold the run's longest request even when empty.

    The contiguous baseline needs that request's reservation (max-len under ``reserve max``), the paged engine
    the blocks of its planned length (max-len - 1 when answers stop at EOS: the engines plan for max_tokens).
    Such a request is rejected at every point: a sweep that serves none, or a part, is no measurement.
    """
    from kvbench.kv.block_pool import blocks_for
    from kvbench.kv.contiguous import reservation_tokens

    if not pairs:
        return
    longest = max(p + (o if stop == "length" else config.max_len - p) - 1 for p, o in pairs)  # KV slots written
    for engine in engines:
        if engine == "contiguous":
            tokens = reservation_tokens(config.reserve, longest, config.max_len)
            what = (f"the contiguous baseline reserves {tokens:,} token slots for its longest request (reserve "
                    f"{config.reserve}{', that is max-len' if config.reserve == 'max' else ''})")
        else:
            tokens = longest
            what = f"the {engine} engine needs {tokens:,} token slots for its longest request"
        need = blocks_for(tokens, config.block_size)
        if need > config.num_blocks:
            size, unit = -(-need * config.block_size * bytes_per_token // 1024), "KiB"  # rounded up: enough
            for bigger in ("MiB", "GiB"):
                if size % 1024 == 0:
                    size, unit = size // 1024, bigger
            slots = f"{config.pool_slots:,} token slots"
            where = source.removeprefix(f"{slots} = ")  # the simulator's source starts with its slots
            other = ("another reservation policy (pow2, oracle)" if engine == "contiguous" and config.reserve == "max"
                     else "shorter requests")
            raise KvbenchError(f"{what}, but the KV pool holds {slots} ({where}): that request could never "
                               f"run; give the pool at least {size}{unit} of KV memory, or use {other}")


def _workload(options: SweepOptions, spec: Scenario, seed: int, count: int, stop: str,
              status: Callable[[str], Any] | None) -> tuple[Workload, Skipped | None, Any]:
    """The requests: a requests file's exact prompts, a dataset's, or lengths drawn from the scenario; and the
    tokenizer loaded to count a dataset (handed on to the model loader)."""
    max_len = spec.lengths.max_len
    dataset = options.dataset or (spec.dataset_path() if spec.dataset and options.requests_file is None else None)
    if dataset is not None and options.requests_file is not None:
        raise KvbenchError("a dataset and a requests file both give the prompts: choose one")
    if options.requests_file is not None:  # replay exact prompts (token ids) and output lengths
        from kvbench.workload.requests_file import load_requests_jsonl

        replay = load_requests_jsonl(options.requests_file)
        kept, skipped = within_max_len([(len(ids), out) for ids, out in replay], max_len,
                                       f"records of {options.requests_file}")
        replay = [replay[index] for index in kept]
        return Workload([(len(ids), out) for ids, out in replay], [ids for ids, _ in replay], stop, max_len), \
            skipped, None
    if dataset is None:
        return Workload(spec.lengths.sample(count, seed), None, stop, max_len), None, None
    from kvbench.models.tokenizers import load_tokenizer

    if status is not None:
        status(f"reading the tokenizer of {options.model}...")
    tokenizer = None if options.simulate and options.model == "tiny" else load_tokenizer(options.model)
    if status is not None:
        status(f"reading dataset {dataset}...")
    return dataset_workload(Path(dataset), tokenizer, max_len, count, seed, stop, options.model), None, tokenizer


def _model_config_hash(model: str) -> str | None:
    """The content hash of a local model's config.json or GGUF header (a preset's shape is fixed by its name)."""
    from kvbench.models.gguf_file import gguf_fingerprint, is_gguf

    path = Path(model)
    if is_gguf(path):
        return gguf_fingerprint(path)
    config = path / "config.json" if path.is_dir() else path
    return content_sha256(config) if config.is_file() else None
