"""Llama-family ``transformers`` models: random weights from a shape, or a local safetensors checkpoint.

The model runner reads its weights from these models; ``transformers`` never runs our forward pass, but its
``generate()`` on the same weights is the reference the runner is tested against.
"""

from __future__ import annotations

import io
import logging
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kvbench.errors import KvbenchError
from kvbench.models.hf_config import (
    SHAPE_ARCHITECTURES,
    model_type_of,
    read_config_json,
    shape_from_config_dict,
)
from kvbench.models.shapes import ModelShape

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TORCH_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}
# What the tensor engine runs: dense Llama-family models. The shape reader costs more (SHAPE_ARCHITECTURES)
# for the waste, capacity and simulation commands.
ENGINE_MODEL_TYPES = ("llama", "mistral")
TIED_EMBED_STD = 0.02
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


# ---------------------------------------------------------------------------------------------- devices


def resolve_torch_device(spec: str = "auto") -> torch.device:
    """``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda`` or ``cuda:N``; a clear error when absent."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise KvbenchError(f"device {spec!r} asked for but CUDA is not available (torch {torch.__version__})")
        device = torch.device(spec)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise KvbenchError(f"device {spec!r} does not exist: {torch.cuda.device_count()} CUDA device(s)")
        return device
    raise KvbenchError(f"unknown device {spec!r}; choose auto, cpu or cuda")


def resolve_torch_dtype(spec: str | torch.dtype | None, device: torch.device | str) -> torch.dtype:
    """The compute dtype: as asked (fp32/fp16/bf16), else fp32 on CPU and fp16 on CUDA."""
    if isinstance(spec, torch.dtype):
        if spec not in TORCH_DTYPES.values():
            raise KvbenchError(f"unsupported dtype {spec}; choose fp32, fp16 or bf16")
        return spec
    if spec is None or spec == "auto":
        return torch.float16 if torch.device(device).type == "cuda" else torch.float32
    dtype = TORCH_DTYPES.get(spec.lower())
    if dtype is None:
        raise KvbenchError(f"unknown dtype {spec!r}; choose fp32, fp16 or bf16")
    return dtype


# ---------------------------------------------------------------------------------------------- random models


def _engine_refusal(what: str) -> str:
    return (
        f"{what}: the tensor engine runs dense Llama-family models ({', '.join(ENGINE_MODEL_TYPES)}); "
        f"the simulator (waste, capacity, a simulated sweep) reads the shapes of {', '.join(SHAPE_ARCHITECTURES)}"
    )


def check_engine_shape(shape: ModelShape) -> None:
    """Refuse a shape the tensor engine cannot run (OPT, mixture of experts, Qwen2's q/k/v-only biases)."""
    model_type = shape.extra.get("model_type", shape.architecture)
    if shape.architecture != "llama" or model_type not in ENGINE_MODEL_TYPES:
        raise KvbenchError(_engine_refusal(f"model {shape.name!r} is {model_type}"))
    if shape.moe is not None:
        raise KvbenchError(_engine_refusal(f"model {shape.name!r} is a mixture of experts"))
    if shape.qkv_bias != shape.o_bias:
        raise KvbenchError(_engine_refusal(f"model {shape.name!r} has biases on q/k/v only"))
    if shape.sliding_layers:
        raise KvbenchError(_engine_refusal(f"model {shape.name!r} has sliding-window layers"))
    if shape.weight_format is not None and not shape.extra.get("gguf"):
        raise KvbenchError(_engine_refusal(f"model {shape.name!r} has {shape.weight_format.describe()} weights"))


def llama_config_from_shape(shape: ModelShape) -> Any:
    """A ``transformers.LlamaConfig`` with the numbers of ``shape`` (GQA, rope theta and scaling, tying)."""
    from transformers import LlamaConfig

    check_engine_shape(shape)
    rope = dict(shape.rope_scaling or {})
    rope["rope_type"] = rope.pop("rope_type", None) or rope.pop("type", None) or "default"
    rope["rope_theta"] = shape.rope_theta
    return LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        rms_norm_eps=shape.rms_norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=shape.tie_word_embeddings,
        attention_bias=shape.qkv_bias,
        mlp_bias=shape.mlp_bias,
        bos_token_id=None,
        eos_token_id=shape.eos_token_id,
        pad_token_id=None,
    )


@torch.no_grad()
def init_random_weights(model: PreTrainedModel, seed: int = 0) -> None:
    """Deterministic weights from ``seed``, scaled so that greedy decoding is not degenerate.

    Matrices get ``N(0, 1/fan_in)`` (activations keep unit scale through the layers), embeddings ``N(0, 1)``,
    norm weights ``1 + N(0, 0.1^2)``, and the LM head twice the matrix scale so that logits spread over a few
    units. Tied embeddings are small (``N(0, 0.02^2)``, else each token mostly predicts itself) and the final
    norm weight is scaled up instead.
    Draws come from one generator on the weights' device, in parameter order.
    """
    params = dict(model.named_parameters())  # tied parameters appear once
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    device = next(iter(params.values())).device
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in params.items():
        if param.ndim == 1:
            if name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, 0.1, generator=generator).add_(1.0)
        elif "embed_tokens" in name:
            param.normal_(0.0, TIED_EMBED_STD if tied else 1.0, generator=generator)
        elif "lm_head" in name:
            param.normal_(0.0, 2.0 / math.sqrt(param.shape[1]), generator=generator)
        else:
            param.normal_(0.0, 1.0 / math.sqrt(param.shape[1]), generator=generator)
    if tied:  # small shared embeddings: the final norm restores a spread of a few units in the logits
        model.model.norm.weight.mul_(2.0 / (TIED_EMBED_STD * math.sqrt(model.config.hidden_size)))


def build_random_model(
    shape: ModelShape, seed: int = 0, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Any:
    """A ``LlamaForCausalLM`` of ``shape`` with deterministic random weights (see :func:`init_random_weights`)."""
    from transformers import LlamaForCausalLM

    config = llama_config_from_shape(shape)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    init_random_weights(model, seed)
    model.generation_config.eos_token_id = shape.eos_token_id
    model.generation_config.pad_token_id = shape.eos_token_id if shape.eos_token_id is not None else 0
    return model.eval()


def round_weights_to_bf16_(model: Any) -> Any:
    """Every parameter of a float32 ``model`` rounded, in place, to the nearest bfloat16 value (still float32).

    Published checkpoints store bfloat16: a random model rounded so holds the same kind of numbers as a real
    one loaded in float32 (what the CPU's AMX path needs, see ``kvbench.kernels.cpu_amx``)."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.bfloat16())
    return model


# ---------------------------------------------------------------------------------------------- local checkpoints


def _read_config(path: Path) -> dict[str, Any]:
    """The checkpoint's config, its architecture checked and every field checked by the shape reader."""
    if not path.exists():
        raise KvbenchError(f"model directory not found: {path}")
    if not path.is_dir():
        raise KvbenchError(f"model path is not a directory: {path}")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise KvbenchError(f"no config.json in model directory {path}")
    config = read_config_json(config_path)
    _check_architecture(config, path)
    shape_from_config_dict(config, config_path)
    return config


def _check_architecture(config: dict[str, Any], path: Path) -> None:
    model_type = model_type_of(config)
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list):
        architectures = [architectures]
    if model_type not in ENGINE_MODEL_TYPES:
        described = f"{model_type!r} ({', '.join(map(str, architectures)) or '-'})"
        raise KvbenchError(_engine_refusal(f"unsupported architecture in {path}: model_type {described}"))
    window = config.get("sliding_window")
    if window is None or not config.get("use_sliding_window", True):
        return
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise KvbenchError(
            f"malformed config {path / 'config.json'}: sliding_window must be a positive integer"
            f" or null, got {window!r}"
        )
    max_positions = config.get("max_position_embeddings")
    if isinstance(max_positions, int) and window < max_positions:
        raise KvbenchError(f"unsupported architecture in {path}: sliding-window attention ({window} tokens)")


def _check_safetensors(path: Path) -> None:
    if any(path.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise KvbenchError(
            f"no safetensors weights in {path} (found {', '.join(pickles[:3])}): kvbench never unpickles"
            " checkpoint files; convert them to safetensors"
        )
    raise KvbenchError(f"no safetensors weights (*.safetensors) in {path}")


def _llama_config_from_dict(config: dict[str, Any]) -> Any:
    from transformers import LlamaConfig

    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "auto_map")}
    try:
        return LlamaConfig.from_dict(fields)
    except (TypeError, ValueError, KeyError) as err:
        raise KvbenchError(f"malformed config: {err}") from None


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No transformers progress bars, notes or warnings while loading: kvbench prints its own lines (and an
    error must be the only line). Bars that transformers draws with plain tqdm (the GGUF dequantization) write
    to stderr, which is held back for the duration."""
    from transformers.utils import logging as hf_logging

    logger = logging.getLogger("transformers")
    level, bars = logger.level, hf_logging.is_progress_bar_enabled()
    logger.setLevel(logging.ERROR)
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings(), redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
        if bars:
            hf_logging.enable_progress_bar()


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def load_local_model(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> Any:
    """Load a Llama-family checkpoint directory (``config.json`` + safetensors) as ``LlamaForCausalLM``."""
    from transformers import LlamaForCausalLM

    path = Path(path)
    raw = _read_config(path)
    _check_safetensors(path)
    config = _llama_config_from_dict(raw)
    dtype = dtype or resolve_torch_dtype(None, device)
    try:
        with quiet_transformers():
            # (model, loading info): transformers annotates only the model, also with output_loading_info
            loaded: Any = LlamaForCausalLM.from_pretrained(
                path,
                config=config,
                dtype=dtype,
                use_safetensors=True,
                local_files_only=True,
                output_loading_info=True,
            )
            model, info = loaded
    except KvbenchError:
        raise
    except Exception as err:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise KvbenchError(f"cannot load weights from {path}: {first_line(err)}") from None
    missing = [k for k in info.get("missing_keys", []) if "rotary_emb" not in k]
    if missing:
        raise KvbenchError(f"checkpoint {path} lacks {len(missing)} weight(s), e.g. {sorted(missing)[0]}")
    return model.to(device).eval()


# ---------------------------------------------------------------------------------------------- GGUF files

GGUF_EXTRA = "pip install 'kvbench[gguf]'"


def require_gguf_support(what: str = "loading a GGUF file") -> None:
    """The optional packages transformers needs to read GGUF weights and tokenizers, or one line naming the extra."""
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise KvbenchError(
            f"{what} needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}: {GGUF_EXTRA}"
        )


def load_gguf_model(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> Any:
    """A Llama-family GGUF file as ``LlamaForCausalLM``, dequantized to ``dtype`` by transformers.

    The header has been checked by the caller (architecture, shape, truncation); this reads the weights.
    """
    from transformers import AutoModelForCausalLM

    path = Path(path)
    require_gguf_support()
    dtype = dtype or resolve_torch_dtype(None, device)
    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=dtype, local_files_only=True
            )
    except KvbenchError:
        raise
    except Exception as err:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise KvbenchError(f"cannot load weights from {path}: {first_line(err)}") from None
    model_type = getattr(model.config, "model_type", None)
    if model_type not in ENGINE_MODEL_TYPES:
        raise KvbenchError(_engine_refusal(f"GGUF file {path} loads as {model_type}"))
    # transformers declares .to with functools.wraps(nn.Module.to), which mypy reads as an unbound function
    return model.to(device).eval()  # type: ignore[arg-type]
