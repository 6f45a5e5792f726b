"""A server's settings resolved once: the model loaded, the KV pool sized and the engine built, as ``sweep`` does.

The model, device, dtype, threads and KV budget go through the sweep's own loading and sizing
(``studies.local_model``, ``studies.backends.tensor.build_tensor_backend``): the same flags mean the same pool.
Without a KV memory size the pool is, on a CPU, a share of the memory available (as vLLM's CPU backend sizes its
cache), and on a GPU the article scenario's budget, as in ``sweep``. The pool must hold one request of the full
max-len (the contiguous engine's reservation under ``reserve max``), as vLLM refuses a cache that cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbench.kv.factory import manager_class
from kvbench.serve.protocol import ModelInfo
from kvbench.values import ThreadChoice

if TYPE_CHECKING:  # the loaders import torch: only the engine process needs them
    from kvbench.engine.config import EngineConfig
    from kvbench.engine.llm_engine import LLMEngine

DEFAULT_SCENARIO = "article"  # where the default KV budget comes from, as in sweep
DEFAULT_MAX_LEN = 2048


@dataclass(frozen=True)
class ServeOptions:
    """A server as asked for; None means "as sweep would choose"."""

    model: str = "tiny"
    engine: str = "paged"
    device: str = "auto"
    dtype: str | None = None
    kv_memory_bytes: int | None = None
    kv_memory_text: str | None = None
    utilization: float | None = None
    block_size: int = 16
    reserve: str = "max"
    admission: str = "queue"
    max_num_seqs: int = 256
    max_len: int | None = None  # None: 2048, or the model's context if shorter
    threads: int | None = None
    seed: int = 0
    served_model_name: str | None = None
    prefix_caching: bool = True  # the paged engine's prefix cache (the contiguous engine has none)
    kv_events: str | None = None  # the ZMQ address the prefix cache's events are published on
    kv_events_replay: str | None = None  # the ZMQ address that replays missed batches


@dataclass
class ServedEngine:
    engine: LLMEngine
    info: ModelInfo
    config: EngineConfig
    device_name: str
    budget_source: str
    threads: ThreadChoice | None  # the CPU threads chosen and why (None: not a CPU engine)


def default_max_len(model: str) -> int:
    from kvbench.models.resolve import resolve_model

    return min(DEFAULT_MAX_LEN, resolve_model(model).max_position_embeddings)


def load_served_engine(options: ServeOptions, status: Callable[[str], Any] | None = None) -> ServedEngine:
    """Load the model and build the engine the server runs (refused before loading when settings cannot work).
    The engine process calls it; the front end never loads the weights."""
    from kvbench.engine.config import EngineConfig
    from kvbench.studies.backends.base import BuildContext
    from kvbench.studies.backends.tensor import TensorBackend, build_tensor_backend
    from kvbench.studies.run_options import SweepOptions
    from kvbench.studies.sweep_setup import check_pool_holds_a_request
    from kvbench.workload.scenario import load_scenario

    max_len = options.max_len or default_max_len(options.model)
    base = EngineConfig(
        engine=options.engine,
        block_size=options.block_size,
        reserve=options.reserve,
        admission=options.admission,
        max_num_seqs=options.max_num_seqs,
        max_len=max_len,
        enable_prefix_caching=options.prefix_caching and manager_class(options.engine).supports_prefix_caching,
    )
    sweep_options = SweepOptions(
        engines=(options.engine,),
        model=options.model,
        device=options.device,
        dtype=options.dtype,
        kv_memory_bytes=options.kv_memory_bytes,
        kv_memory_text=options.kv_memory_text,
        utilization=options.utilization,
        block_size=options.block_size,
        threads=options.threads,
    )
    setup = build_tensor_backend(
        BuildContext(sweep_options, base, load_scenario(DEFAULT_SCENARIO), options.seed, status, server=True)
    )
    backend, device_name, vocab, source = setup.backend, setup.device_name, setup.vocab_size, setup.budget_source
    assert isinstance(backend, TensorBackend)  # what build_tensor_backend builds: engines and a loaded model
    # one request of the full max-len must fit in the empty pool (the reservation for the contiguous engine)
    check_pool_holds_a_request(
        backend.base, [options.engine], [(1, max_len - 1)], "length", backend.bytes_per_token, source
    )
    engine = backend.engine(options.engine)
    loaded = backend.loaded
    name = options.served_model_name or options.model
    info = ModelInfo(
        name=name,
        max_len=max_len,
        vocab_size=vocab,
        tokenizer=loaded.tokenizer,
        parallel_sampling=manager_class(options.engine).can_fork,
    )
    return ServedEngine(engine, info, backend.base, device_name, source, backend.threads)
