"""A model's shape as a run records it (``ModelShape.to_dict``: ``meta.model_shape``, a run's ``model``, the capacity
study's ``model``): the facts reports state about the model, typed. The record holds more fields; a field the run did
not record, or recorded as something other than a number or a name, is None."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.values import is_number, text_or_none


@dataclass(frozen=True)
class ModelShapeFacts:
    architecture: str | None = None  # llama, qwen2, ...
    num_layers: int | None = None
    hidden_size: int | None = None
    num_heads: int | None = None  # query heads
    num_kv_heads: int | None = None  # None: as many as the query heads
    head_dim: int | None = None
    num_parameters: float | None = None
    dtype: str | None = None  # the weights' dtype name
    bytes_per_token: int | None = None  # KV bytes per token
    name: str | None = None  # the preset, checkpoint or Hugging Face id the shape was read from
    active_parameters: int | None = None  # a mixture of experts: the parameters one token uses
    weight_format: str | None = None  # quantized weights: how they are stored
    latent_values: int | None = None  # latent attention: values cached per layer (kv_lora_rank + qk_rope_head_dim)
    sliding_window: int | None = None  # tokens a windowed layer keeps
    sliding_layers: int = 0  # how many layers keep only the window

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelShapeFacts:
        weight_format, mla, sliding = data.get("weight_format"), data.get("mla"), data.get("sliding_layers")
        rank = _count(mla.get("kv_lora_rank")) if isinstance(mla, Mapping) else None
        rope = _count(mla.get("qk_rope_head_dim")) if isinstance(mla, Mapping) else None
        return cls(
            architecture=text_or_none(data.get("architecture")),
            num_layers=_count(data.get("num_layers")),
            hidden_size=_count(data.get("hidden_size")),
            num_heads=_count(data.get("num_heads")),
            num_kv_heads=_count(data.get("num_kv_heads")),
            head_dim=_count(data.get("head_dim")),
            num_parameters=value if is_number(value := data.get("num_parameters"), finite=True) else None,
            dtype=text_or_none(data.get("dtype")),
            bytes_per_token=_count(data.get("bytes_per_token")),
            name=text_or_none(data.get("name")),
            active_parameters=_count(data.get("active_parameters")),
            weight_format=(
                text_or_none(weight_format.get("description")) if isinstance(weight_format, Mapping) else None
            ),
            latent_values=rank + rope if rank is not None and rope is not None else None,
            sliding_window=_count(data.get("sliding_window")),
            sliding_layers=len(sliding) if isinstance(sliding, list) else 0,
        )


def _count(value: Any) -> int | None:
    """An int as the shape records its counts; unlike ``values.int_or_none`` a float (``64.0``) is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
