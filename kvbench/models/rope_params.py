"""Rotary settings of a config, checked without torch: the shape reader and the model runner share these rules.

A check returns nothing or raises :class:`KvbenchError` with a message that names the field (for example
``rope_scaling.factor must be a positive number, got 0``); callers prefix the file it came from.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from kvbench.errors import KvbenchError
from kvbench.values import is_number

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")

REQUIRED_PARAMS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "yarn": (),
}

# Parameters that scale frequencies or lengths: a zero, negative or non-finite value gives NaN or infinite angles.
_POSITIVE_PARAMS = ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "attention_factor")
# YaRN's magnitude corrections: 0 (or absent) switches them off, so only negatives are wrong.
_NON_NEGATIVE_PARAMS = ("mscale", "mscale_all_dim")


def is_positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_positive_number(value: Any, field: str) -> float:
    """``value`` as a float when it is a finite number > 0."""
    if not is_number(value, finite=True) or value <= 0:
        raise KvbenchError(f"{field} must be a positive number, got {value!r}")
    return float(value)


def split_rope_scaling(scaling: Any, field: str = "rope_scaling") -> tuple[str, dict[str, Any]]:
    """The rope type and its parameters from a ``rope_scaling`` / ``rope_parameters`` object, checked.

    ``type`` (transformers 4) and ``rope_type`` both name the type; ``rope_theta`` is not a scaling parameter
    and is dropped. ``None`` or an empty object mean no scaling.
    """
    if scaling is None:
        return "default", {}
    if not isinstance(scaling, dict):
        raise KvbenchError(
            f'{field} must be a JSON object such as {{"rope_type": "linear", "factor": 2.0}}, got {scaling!r}'
        )
    params = dict(scaling)
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    params.pop("rope_theta", None)
    if rope_type not in ROPE_TYPES:
        raise KvbenchError(
            f"unsupported rope scaling type {rope_type!r} in {field}; supported: {', '.join(ROPE_TYPES)}"
        )
    _check_params(rope_type, params, field)
    return rope_type, params


def _check_params(rope_type: str, params: dict[str, Any], field: str) -> None:
    missing = [name for name in REQUIRED_PARAMS[rope_type] if params.get(name) is None]
    if missing:
        raise KvbenchError(f"rope scaling {rope_type!r} needs {', '.join(missing)} in {field}")
    for name in _POSITIVE_PARAMS:
        if params.get(name) is not None:
            check_positive_number(params[name], f"{field}.{name}")
    for name in _NON_NEGATIVE_PARAMS:
        value = params.get(name)
        if value is not None and (not is_number(value, finite=True) or value < 0):
            raise KvbenchError(f"{field}.{name} must be a number >= 0, got {value!r}")
    original = params.get("original_max_position_embeddings")
    if original is not None and not is_positive_int(original):
        raise KvbenchError(f"{field}.original_max_position_embeddings must be a positive integer, got {original!r}")
    partial = params.get("partial_rotary_factor", 1.0)
    if not is_number(partial, finite=True) or not 0 < partial <= 1:
        raise KvbenchError(f"{field}.partial_rotary_factor must be in (0, 1], got {partial!r}")
    if rope_type == "llama3" and params["high_freq_factor"] <= params["low_freq_factor"]:
        # the smoothing ramp divides by (high - low)
        raise KvbenchError(
            f"{field}: high_freq_factor ({params['high_freq_factor']}) must exceed low_freq_factor "
            f"({params['low_freq_factor']})"
        )


def check_rotary_head_dim(head_dim: int) -> None:
    """Rotary embeddings rotate pairs of dimensions: an odd head_dim has no partner for its last one."""
    if head_dim % 2:
        raise KvbenchError(f"head_dim {head_dim} is odd: rotary embeddings need an even head_dim")


def check_rope_theta(theta: Any, field: str = "rope_theta") -> float:
    """The rotary base: frequencies are ``theta ** (-2i/d)``, so it must be a finite number > 0."""
    return check_positive_number(theta, field)


def scaled_context_length(rope_type: str, params: dict[str, Any], max_position_embeddings: int) -> int:
    """The context length a rotary scaling is meant to reach, from ``max_position_embeddings``.

    ``dynamic`` (NTK) keeps ``max_position_embeddings`` as the pretraining length and stretches past it up to
    ``factor`` times; ``yarn`` reaches ``factor`` times its original length. The other types already write
    the extended length into ``max_position_embeddings``.
    """
    if rope_type == "dynamic":
        return max(max_position_embeddings, int(max_position_embeddings * params["factor"]))
    if rope_type == "yarn" and params.get("factor") is not None:
        original = params.get("original_max_position_embeddings") or max_position_embeddings
        return max(max_position_embeddings, int(original * params["factor"]))
    return max_position_embeddings
