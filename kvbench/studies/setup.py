"""Turn user choices (model, device, dtype, KV budget) into a loaded model and engines over it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.models.hf_model import (
    build_random_model,
    check_engine_shape,
    load_local_model,
    resolve_torch_device,
    resolve_torch_dtype,
)
from kvbench.models.shapes import MODEL_PRESETS, ModelShape, resolve_model
from kvbench.models.threads import ThreadChoice, choose_threads
from kvbench.preflight import (
    check_context_length,
    check_kv_pool_for_device,
    check_model_memory_for_device,
    check_weights_for_host,
)

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass
class LoadedModel:
    shape: ModelShape
    model: object
    device: torch.device
    dtype: torch.dtype
    threads: ThreadChoice | None = None  # CPU only: the intra-op threads the matmuls use, and why

    @property
    def eos_token_id(self) -> int | None:
        return self.shape.eos_token_id


def load_model(
    spec: str, device: str = "auto", dtype: str | None = None, seed: int = 0, max_len: int | None = None,
    threads: int | None = None,
) -> LoadedModel:
    """A preset with random weights from ``seed``, or a local checkpoint directory (safetensors only).

    Refused before any weight is allocated: a shape the tensor engine does not run, a ``max_len`` past the
    model's context, and weights plus activations that do not fit in what the device has free.
    """
    torch_device = resolve_torch_device(device)
    torch_dtype = resolve_torch_dtype(dtype, torch_device)
    shape = resolve_model(spec).with_dtype(_DTYPE_NAMES[torch_dtype])
    check_engine_shape(shape)
    if max_len is not None:
        check_context_length(shape, max_len)
    check_model_memory_for_device(shape, torch_device)
    if spec not in MODEL_PRESETS and torch_device.type != "cpu":
        check_weights_for_host(shape)  # a checkpoint is loaded on the host, then moved
    choice = None
    if torch_device.type == "cpu":  # the thread count by measurement (see kvbench.models.threads), or as asked
        choice = choose_threads(shape.hidden_size, shape.intermediate_size, threads)
    if spec in MODEL_PRESETS:
        model = build_random_model(shape, seed=seed, device=torch_device, dtype=torch_dtype)
    else:
        model = load_local_model(Path(spec), device=torch_device, dtype=torch_dtype)
    return LoadedModel(shape, model, torch_device, torch_dtype, choice)


def blocks_for_budget(kv_bytes: int, shape: ModelShape, block_size: int) -> int:
    """How many blocks of ``block_size`` tokens fit in ``kv_bytes``."""
    per_block = shape.bytes_per_token * block_size
    return kv_bytes // per_block


def cuda_kv_budget(loaded: LoadedModel, utilization: float) -> int:
    """vLLM's rule on a real GPU: utilization x total memory, minus what is already used, minus activations."""
    from kvbench.models.gpus import activation_reserve_bytes

    free, total = torch.cuda.mem_get_info(loaded.device)
    used = total - free
    return int(utilization * total) - used - activation_reserve_bytes(loaded.shape)


def build_engine(loaded: LoadedModel, config: EngineConfig) -> LLMEngine:
    """An engine over ``loaded``; its KV pool is checked against what the device has free before it is allocated."""
    check_kv_pool_for_device(loaded.shape, loaded.device, config.num_blocks, config.block_size)
    return LLMEngine(loaded.model, config, eos_token_id=loaded.eos_token_id)
