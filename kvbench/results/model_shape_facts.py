"""A model's shape as a run records it (``meta.model_shape``, or a run's ``model``): the few facts a report states
about the model, typed. The record holds many more fields (``ModelShape.to_dict``); a field the run did not record,
or recorded as something other than a number or a name, is None."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.values import is_number


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelShapeFacts:
        return cls(
            architecture=_name(data.get("architecture")),
            num_layers=_count(data.get("num_layers")),
            hidden_size=_count(data.get("hidden_size")),
            num_heads=_count(data.get("num_heads")),
            num_kv_heads=_count(data.get("num_kv_heads")),
            head_dim=_count(data.get("head_dim")),
            num_parameters=value if is_number(value := data.get("num_parameters"), finite=True) else None,
            dtype=_name(data.get("dtype")),
            bytes_per_token=_count(data.get("bytes_per_token")),
        )


def _name(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
