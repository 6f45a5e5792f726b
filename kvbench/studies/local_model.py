"""Turn user choices (model, device, dtype, KV budget) into a loaded model and engines over it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvbench import kernels
from kvbench.cpu import cpu_choices, cpu_heap, cpu_linear, decode_prefetch
from kvbench.cpu.cpu_choices import MatmulPlan
from kvbench.cpu.decode_prefetch import PrefetchChoice
from kvbench.cpu.threads import choose_threads
from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.errors import KvbenchError
from kvbench.models.gguf_file import is_gguf
from kvbench.models.gpus import activation_reserve_bytes
from kvbench.models.hf_model import (
    build_random_model,
    check_engine_shape,
    load_gguf_model,
    load_local_model,
    require_gguf_support,
    resolve_torch_device,
    resolve_torch_dtype,
)
from kvbench.models.resolve import is_hub_only, resolve_model
from kvbench.models.shapes import MODEL_PRESETS, ModelShape
from kvbench.models.tokenizers import load_tokenizer, stop_token_ids
from kvbench.preflight import (
    check_context_length,
    check_kv_pool_for_device,
    check_model_memory_for_device,
    check_weights_for_host,
)
from kvbench.values import ThreadChoice

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


_UNSET = object()


@dataclass
class LoadedModel:
    shape: ModelShape
    model: object
    device: torch.device
    dtype: torch.dtype
    tokenizer: Any = None  # None for presets (random weights) and checkpoints without tokenizer files
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)  # EOS and other ids that end a request
    real_weights: bool = False  # a checkpoint (not a preset's random weights)
    threads: ThreadChoice | None = None  # CPU only: the intra-op threads the matmuls use, and why
    matmul_plan: MatmulPlan | None = None  # CPU with packing: each weight's matmul path by row count, measured
    decode_prefetch: PrefetchChoice | None = None  # CPU, C kernels: the decode attention's prefetch, measured

    @property
    def eos_token_id(self) -> int | None:
        return self.shape.eos_token_id

    @property
    def can_stop_at_eos(self) -> bool:
        """Real weights and a tokenizer: the model decides when an answer ends."""
        return self.real_weights and self.tokenizer is not None and bool(self.stop_token_ids)


def load_model(
    spec: str,
    device: str = "auto",
    dtype: str | None = None,
    seed: int = 0,
    max_len: int | None = None,
    tokenizer: Any = _UNSET,
    threads: int | None = None,
    block_size: int | None = None,
) -> LoadedModel:
    """A preset with random weights from ``seed``, a local checkpoint directory (safetensors only) or a GGUF file
    (dequantized to the run's dtype), with its tokenizer (pass ``tokenizer`` when it is already loaded). With the
    engines' ``block_size`` on a CPU, the decode attention's prefetch is chosen now too (to print it up front).

    Refused before any weight is allocated: a shape the tensor engine does not run (read from ``config.json``
    or the GGUF header), a ``max_len`` past the model's context, and weights plus activations that do not fit
    in what the device has free.
    """
    if is_hub_only(spec):
        raise KvbenchError(
            f"model {spec!r} is a Hugging Face id with no local copy: it gives the shape that capacity "
            "and waste cost, but a run needs the checkpoint's files on disk (download it, pass its path)"
        )
    torch_device = resolve_torch_device(device)
    torch_dtype = resolve_torch_dtype(dtype, torch_device)
    shape = resolve_model(spec).with_dtype(_DTYPE_NAMES[torch_dtype])
    check_engine_shape(shape)
    if max_len is not None:
        check_context_length(shape, max_len)
    check_model_memory_for_device(shape, torch_device)
    if spec not in MODEL_PRESETS and torch_device.type != "cpu":
        check_weights_for_host(shape)  # a checkpoint is loaded on the host, then moved
    gguf = spec not in MODEL_PRESETS and is_gguf(Path(spec))
    if gguf:
        require_gguf_support()  # before the tokenizer and the weights: one line naming the extra
    if tokenizer is _UNSET:
        tokenizer = load_tokenizer(spec)
    if spec in MODEL_PRESETS:
        model = build_random_model(shape, seed=seed, device=torch_device, dtype=torch_dtype)
    elif gguf:
        model = load_gguf_model(Path(spec), device=torch_device, dtype=torch_dtype)
    else:
        model = load_local_model(Path(spec), device=torch_device, dtype=torch_dtype)
    choice = plan = prefetch = None
    if torch_device.type == "cpu":  # the thread count by measurement (see kvbench.cpu.threads), or as asked
        choice = choose_threads(
            shape.hidden_size,
            shape.intermediate_size,
            threads,
            probe=_gate_up_probe(model),
            dtype=torch_dtype,
            cache=True,
        )
        plan = _matmul_plan(model, torch_device, torch_dtype)
        if block_size is not None and decode_prefetch.applies(
            torch_device, kernels.resolve_backend(torch_device, None), torch_dtype
        ):
            try:
                prefetch = decode_prefetch.choice_for(model, block_size, torch_dtype)
            except ValueError as error:  # an unknown KVBENCH_DECODE_PREFETCH
                raise KvbenchError(str(error)) from None
        cpu_heap.keep_freed_memory()  # what the runners would do: applied here, so a run prints it before its points
    extra = [shape.eos_token_id] if shape.eos_token_id is not None else []
    stops = stop_token_ids(model, tokenizer, extra)
    return LoadedModel(
        shape, model, torch_device, torch_dtype, tokenizer, stops, spec not in MODEL_PRESETS, choice, plan, prefetch
    )


def _matmul_plan(model: Any, device: torch.device, dtype: torch.dtype) -> MatmulPlan | None:
    """Each matmul weight's path by row count on this CPU at the chosen threads (measured or cached; see
    kvbench.cpu.cpu_choices), kept on the model for its runners; None where nothing is packed."""
    from kvbench.models.runner import matmul_weights

    if not cpu_linear.packing_available(device, dtype):
        return None
    try:
        return cpu_choices.plan_for(model, matmul_weights(model))
    except ValueError as error:  # an unknown KVBENCH_MATMUL
        raise KvbenchError(str(error)) from None


def _gate_up_probe(model: Any):
    """The thread choice's probe: the model's fused gate/up projection as the runner will multiply it."""

    def probe():
        mlp = model.model.layers[0].mlp
        return cpu_linear.probe_linear(torch.cat([mlp.gate_proj.weight.data, mlp.up_proj.weight.data]))

    return probe


def cuda_kv_budget(loaded: LoadedModel, utilization: float) -> int:
    """vLLM's rule on a real GPU: utilization x total memory, minus what is already used, minus activations."""
    free, total = torch.cuda.mem_get_info(loaded.device)
    used = total - free
    return int(utilization * total) - used - activation_reserve_bytes(loaded.shape)


def packed_weight_bytes(loaded: LoadedModel) -> int:
    """What the first engine over ``loaded`` adds by packing its matmul weights for the CPU (0 where it will not)."""
    if not cpu_linear.packing_available(loaded.device, loaded.dtype):
        return 0
    plan = loaded.matmul_plan
    copies = plan.copies(loaded.shape.num_layers) if plan else None
    return cpu_linear.packed_copy_bytes(loaded.model, copies)


def build_engine(loaded: LoadedModel, config: EngineConfig) -> LLMEngine:
    """An engine over ``loaded``; its KV pool (and packed weights) are checked against what the device has free."""
    check_kv_pool_for_device(
        loaded.shape, loaded.device, config.num_blocks, config.block_size, extra_weights=packed_weight_bytes(loaded)
    )
    return LLMEngine(loaded.model, config, eos_token_id=loaded.eos_token_id, stop_token_ids=loaded.stop_token_ids)
