"""Rotary position embeddings: inverse frequencies for the rope-scaling types of Llama-family configs.

Supported ``rope_type`` values: ``default`` (no scaling), ``linear`` (position interpolation), ``dynamic``
(NTK-aware base that grows with the sequence), ``llama3`` (per-wavelength smoothing) and ``yarn``. The
numbers follow the published formulas and agree with ``transformers`` (tested).

``dynamic`` follows the ``transformers`` semantics: the frequencies of a forward pass depend on the sequence
length seen at that pass. Here that length is each request's own context length, so a request's rotation
never depends on its batch neighbours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from kvbench.errors import KvbenchError
from kvbench.models.rope_params import (
    REQUIRED_PARAMS,
    ROPE_TYPES,
    check_rope_theta,
    check_rotary_head_dim,
    split_rope_scaling,
)


@dataclass(frozen=True)
class RopeConfig:
    """What decides the rotation: rotary dimension, base, context length of pretraining and the scaling."""

    head_dim: int
    theta: float = 10000.0
    max_position_embeddings: int = 4096
    rope_type: str = "default"
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise KvbenchError(f"unsupported rope scaling type {self.rope_type!r}; supported: {', '.join(ROPE_TYPES)}")
        missing = [name for name in REQUIRED_PARAMS[self.rope_type] if self.params.get(name) is None]
        if missing:
            raise KvbenchError(f"rope scaling {self.rope_type!r} needs {', '.join(missing)}")
        check_rotary_head_dim(self.head_dim)
        check_rope_theta(self.theta)
        if self.max_position_embeddings < 1:
            raise KvbenchError(f"max_position_embeddings must be positive, got {self.max_position_embeddings}")

    @property
    def original_max_position_embeddings(self) -> int:
        return int(self.params.get("original_max_position_embeddings") or self.max_position_embeddings)


def rope_config(
    head_dim: int, theta: float, max_position_embeddings: int, scaling: dict[str, Any] | None
) -> RopeConfig:
    """Build a :class:`RopeConfig` from a Hugging Face style ``rope_scaling`` dict (``type`` or ``rope_type``)."""
    rope_type, params = split_rope_scaling(scaling)
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise KvbenchError("partial rotary embeddings (partial_rotary_factor < 1) are not supported")
    return RopeConfig(head_dim, check_rope_theta(theta), int(max_position_embeddings), rope_type, params)


def rope_config_from_hf(config: Any) -> RopeConfig:
    """Read the rotary settings of a ``transformers`` config (v5 ``rope_parameters`` or v4 ``rope_scaling``)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    if theta is None:
        theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = 10000.0
    return rope_config(head_dim, theta, config.max_position_embeddings, params)


def _base_inv_freq(theta: float | torch.Tensor, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """``1 / theta^(2i/dim)`` for i in 0..dim/2; ``theta`` may be a column of per-token bases."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    return 1.0 / (theta**exponents)


def _linear_inv_freq(cfg: RopeConfig, device: torch.device | None) -> torch.Tensor:
    return _base_inv_freq(cfg.theta, cfg.head_dim, device) / cfg.params["factor"]


def _llama3_inv_freq(cfg: RopeConfig, device: torch.device | None) -> torch.Tensor:
    """Long wavelengths are divided by ``factor``, short ones kept, the middle band interpolated smoothly."""
    inv_freq = _base_inv_freq(cfg.theta, cfg.head_dim, device)
    factor = cfg.params["factor"]
    low, high = cfg.params["low_freq_factor"], cfg.params["high_freq_factor"]
    old_len = cfg.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    long_wave = wavelen > old_len / low
    short_wave = wavelen < old_len / high
    scaled = torch.where(long_wave, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    return torch.where(~short_wave & ~long_wave, blended, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_attention_factor(cfg: RopeConfig, factor: float) -> float:
    given = cfg.params.get("attention_factor")
    if given is not None:
        return float(given)
    mscale, mscale_all_dim = cfg.params.get("mscale"), cfg.params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
    return _yarn_mscale(factor)


def _yarn_dim_for_rotations(rotations: float, dim: int, theta: float, length: int) -> float:
    """The rotary dimension whose wavelength makes ``rotations`` turns over ``length`` positions."""
    return (dim * math.log(length / (rotations * 2 * math.pi))) / (2 * math.log(theta))


def _yarn_inv_freq(cfg: RopeConfig, device: torch.device | None) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies, keep the high ones, ramp linearly in between."""
    dim, theta = cfg.head_dim, cfg.theta
    old_len = cfg.original_max_position_embeddings
    factor = cfg.params.get("factor") or cfg.max_position_embeddings / old_len
    beta_fast = cfg.params.get("beta_fast") or 32
    beta_slow = cfg.params.get("beta_slow") or 1
    low = _yarn_dim_for_rotations(beta_fast, dim, theta, old_len)
    high = _yarn_dim_for_rotations(beta_slow, dim, theta, old_len)
    if cfg.params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(device)
    keep = 1 - ramp  # 1: extrapolate (keep the original frequency), 0: interpolate (divide by factor)
    pos_freqs = theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep
    return inv_freq, _yarn_attention_factor(cfg, factor)


def compute_inv_freq(cfg: RopeConfig, device: torch.device | None = None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies ``[head_dim/2]`` (fp32) and the factor that scales cos/sin, at pretraining length."""
    if cfg.rope_type == "linear":
        return _linear_inv_freq(cfg, device), 1.0
    if cfg.rope_type == "llama3":
        return _llama3_inv_freq(cfg, device), 1.0
    if cfg.rope_type == "yarn":
        return _yarn_inv_freq(cfg, device)
    return _base_inv_freq(cfg.theta, cfg.head_dim, device), 1.0


def dynamic_ntk_inv_freq(cfg: RopeConfig, seq_lens: torch.Tensor) -> torch.Tensor:
    """Per-row inverse frequencies ``[N, head_dim/2]`` of dynamic NTK scaling for sequence lengths ``[N]``."""
    dim, factor, max_pos = cfg.head_dim, cfg.params["factor"], cfg.max_position_embeddings
    lens = torch.clamp(seq_lens.to(torch.int64), min=max_pos)
    theta = cfg.theta * ((factor * lens / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return _base_inv_freq(theta[:, None], dim, seq_lens.device)


class RotaryEmbedding:
    """Rotation tables indexed by position, for packed ``[T, heads, head_dim]`` tensors.

    Tables are full width in the Llama "halves" layout: ``cos = [c, c]`` and a *signed* sine ``[-s, s]``, so
    that :func:`apply_rotary` is ``x * cos + swap_halves(x) * signed_sin`` (what ``transformers`` computes as
    ``x * cos + rotate_half(x) * sin``, value for value).
    """

    def __init__(self, cfg: RopeConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = dtype
        self.inv_freq, self.attention_scaling = compute_inv_freq(cfg, self.device)
        self._cos = self._sin = torch.empty(0, cfg.head_dim, device=self.device, dtype=dtype)
        self._grow(max(cfg.max_position_embeddings, 1))

    @property
    def table_len(self) -> int:
        return self._cos.shape[0]

    def _grow(self, length: int) -> None:
        positions = torch.arange(length, device=self.device, dtype=torch.int64).float()
        self._cos, self._sin = self._tables(positions[:, None] * self.inv_freq[None, :])

    def _tables(self, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-width cos and signed sin ``[N, head_dim]`` of angles ``freqs [N, head_dim/2]``."""
        cos = freqs.cos() * self.attention_scaling
        sin = freqs.sin() * self.attention_scaling
        return torch.cat((cos, cos), -1).to(self.dtype), torch.cat((-sin, sin), -1).to(self.dtype)

    def rotation(
        self, positions: torch.Tensor, max_position: int, seq_lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin ``[T, head_dim]`` of the tokens at ``positions [T]``, for :func:`apply_rotary`.

        ``max_position`` is the largest entry of ``positions`` (known on the host, so no device sync).
        ``seq_lens [T]`` is the context length of each token's request; only dynamic NTK scaling reads it.
        """
        if self.cfg.rope_type == "dynamic" and max_position + 1 > self.cfg.max_position_embeddings:
            if seq_lens is None:
                raise ValueError("dynamic rope scaling needs the context length of every token")
            cos, sin = self._tables(positions.float()[:, None] * dynamic_ntk_inv_freq(self.cfg, seq_lens))
            short = (seq_lens <= self.cfg.max_position_embeddings)[:, None]
            within = positions.clamp(max=self.table_len - 1)
            return torch.where(short, self._cos[within], cos), torch.where(short, self._sin[within], sin)
        if max_position >= self.table_len:
            self._grow(max(2 * self.table_len, max_position + 1))
        return self._cos[positions], self._sin[positions]

    def cos_sin(
        self, positions: torch.Tensor, max_position: int, seq_lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, head_dim]`` as ``transformers`` returns them (``[c, c]`` and ``[s, s]``)."""
        cos, signed_sin = self.rotation(positions, max_position, seq_lens)
        half = self.cfg.head_dim // 2
        return cos, torch.cat((-signed_sin[:, :half], signed_sin[:, half:]), -1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` by the tables of :meth:`RotaryEmbedding.rotation` (``[T, head_dim]``)."""
    swapped = torch.roll(x, x.shape[-1] // 2, dims=-1)  # [x2, x1]
    return x * cos[:, None, :] + swapped * signed_sin[:, None, :]
