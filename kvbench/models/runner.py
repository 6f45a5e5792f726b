"""The model runner: a Llama-family forward pass over a paged KV pool, weights read from a ``transformers`` model.

One :meth:`ModelRunner.forward` call runs one engine step: the new tokens of all scheduled requests are
packed into ``[T, hidden]``; every linear layer runs once on the pack; per layer the new K/V are scattered
into their slots (``write_kv``) and attention reads each request's context through its block table
(``paged_decode_attention`` when every request brings one token, ``paged_prefill_attention`` otherwise, which
also covers a chunk after cached context: recompute after preemption, shared prefixes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kvbench import kernels
from kvbench.models.rope import RotaryEmbedding, apply_rotary, rope_config_from_hf

RequestChunk = tuple[list[int], int, list[int]]  # (new token ids, tokens already cached, block table)


@dataclass
class StepInput:
    """The tensors of one step, on the runner's device."""

    input_ids: torch.Tensor  # [T] int64, new tokens of all requests packed
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, slot of each new token
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    query_start_loc: torch.Tensor  # [B+1] int32
    context_lens: torch.Tensor  # [B] int32, total length including the new tokens
    is_decode: bool  # every request has exactly one new token
    max_context_len: int = -1  # host copy of context_lens.max(); -1: unknown, read from the tensor
    max_query_len: int = -1  # host copy of the most new tokens of one request; -1: unknown

    @property
    def num_requests(self) -> int:
        return self.context_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


@dataclass
class LayerWeights:
    """References to one decoder layer's ``transformers`` parameters."""

    input_norm: torch.Tensor
    q_proj: torch.Tensor
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    gate_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    @classmethod
    def from_hf(cls, layer: Any) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp

        def bias(module: Any) -> torch.Tensor | None:
            return module.bias.data if module.bias is not None else None

        return cls(
            input_norm=layer.input_layernorm.weight.data,
            q_proj=attn.q_proj.weight.data, k_proj=attn.k_proj.weight.data,
            v_proj=attn.v_proj.weight.data, o_proj=attn.o_proj.weight.data,
            post_norm=layer.post_attention_layernorm.weight.data,
            gate_proj=mlp.gate_proj.weight.data, up_proj=mlp.up_proj.weight.data,
            down_proj=mlp.down_proj.weight.data,
            q_bias=bias(attn.q_proj), k_bias=bias(attn.k_proj), v_bias=bias(attn.v_proj),
            o_bias=bias(attn.o_proj), gate_bias=bias(mlp.gate_proj), up_bias=bias(mlp.up_proj),
            down_bias=bias(mlp.down_proj),
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm ``x / sqrt(mean(x^2) + eps) * weight`` (one fused op, fp32 accumulation)."""
    return F.rms_norm(x, weight.shape, weight, eps)


def _known(value: int) -> int | None:
    """A host-side maximum for the kernels (it saves them a device sync), or None when unknown."""
    return value if value >= 0 else None


def _slots(table: list[int], block_size: int, start: int, end: int) -> list[int]:
    """Slots of positions ``start..end-1`` under ``table``, one ``range`` per block touched."""
    slots: list[int] = []
    position = start
    while position < end:
        block, offset = divmod(position, block_size)
        run = min(block_size - offset, end - position)
        base = table[block] * block_size + offset
        slots.extend(range(base, base + run))
        position += run
    return slots


def kv_bytes_per_block(config: Any, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers, K and V."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.num_key_value_heads * head_dim * elem


class ModelRunner:
    """Owns the forward pass and the KV pool (per layer ``[num_blocks, block_size, num_kv_heads, head_dim]``)."""

    def __init__(
        self,
        model: Any,
        num_blocks: int,
        block_size: int,
        kv_dtype: torch.dtype | None = None,
        kernel_backend: str | None = None,
    ) -> None:
        """Keep references to ``model``'s parameters; allocate ``num_blocks`` blocks of ``block_size`` slots.

        ``kv_dtype`` defaults to the model's dtype; ``kernel_backend`` ("torch" | "triton") overrides the
        kernels' choice by device.
        """
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        config = model.config
        first = next(model.parameters())
        self.config = config
        self.device = first.device
        self.dtype = first.dtype
        self.kv_dtype = kv_dtype or self.dtype
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.kernel_backend = kernel_backend
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.vocab_size = config.vocab_size
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self._read_weights(model)
        self.rope = RotaryEmbedding(rope_config_from_hf(config), self.device, self.dtype)
        self.k_caches, self.v_caches = self._allocate_kv_pool()

    # ------------------------------------------------------------------ setup

    def _read_weights(self, model: Any) -> None:
        backbone = model.model
        self.embed_tokens = backbone.embed_tokens.weight.data
        self.final_norm = backbone.norm.weight.data
        self.lm_head = model.lm_head.weight.data
        self.layers = [LayerWeights.from_hf(layer) for layer in backbone.layers]

    def _allocate_kv_pool(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        shape = (self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        k_caches, v_caches = [], []
        for _ in self.layers:
            k_caches.append(torch.zeros(shape, dtype=self.kv_dtype, device=self.device))
            v_caches.append(torch.zeros(shape, dtype=self.kv_dtype, device=self.device))
        return k_caches, v_caches

    @property
    def kv_pool_bytes(self) -> int:
        """Bytes of the whole KV pool (all layers, K and V)."""
        return sum(t.numel() * t.element_size() for t in (*self.k_caches, *self.v_caches))

    @property
    def bytes_per_block(self) -> int:
        return self.kv_pool_bytes // self.num_blocks

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    # ------------------------------------------------------------------ step tensors

    def build_step(self, requests: list[RequestChunk]) -> StepInput:
        """Pack ``(new_token_ids, num_cached_tokens_before, block_table)`` per request into step tensors.

        Work on the host is per request and per block, never per token.
        """
        if not requests:
            raise ValueError("build_step needs at least one request")
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        context_lens: list[int] = []
        max_query_len = 0
        width = max(len(table) for _, _, table in requests)
        tables: list[list[int]] = []
        for new_ids, num_cached, table in requests:
            total = num_cached + len(new_ids)
            if not new_ids:
                raise ValueError("a request in a step must bring at least one new token")
            if len(table) * bs < total:
                raise ValueError(f"block table of {len(table)} blocks cannot hold {total} tokens")
            ids.extend(new_ids)
            positions.extend(range(num_cached, total))
            slots.extend(_slots(table, bs, num_cached, total))
            starts.append(starts[-1] + len(new_ids))
            max_query_len = max(max_query_len, len(new_ids))
            context_lens.append(total)
            tables.append(table if len(table) == width else [*table, *([0] * (width - len(table)))])
        return StepInput(
            input_ids=self._to_device(ids, torch.int64),
            positions=self._to_device(positions, torch.int64),
            slot_mapping=self._to_device(slots, torch.int64),
            block_tables=self._to_device(tables, torch.int32),
            query_start_loc=self._to_device(starts, torch.int32),
            context_lens=self._to_device(context_lens, torch.int32),
            is_decode=len(ids) == len(requests),
            max_context_len=max(context_lens),
            max_query_len=max_query_len,
        )

    def build_decode_step(self, tokens: list[int], positions: list[int], tables: list[list[int]]) -> StepInput:
        """The common decode step: one new token per request at ``positions[b]`` (its cached length).

        Same tensors as ``build_step``, packed into one host array and moved in one copy: building six small
        tensors from Python lists cost more than the whole packing (measured 131 us vs 41 us at 50 requests).
        """
        bs = self.block_size
        count = len(tokens)
        width = max(map(len, tables))
        flat = list(tokens)
        flat += positions
        flat += [table[pos // bs] * bs + pos % bs for table, pos in zip(tables, positions, strict=True)]
        flat += [pos + 1 for pos in positions]
        flat += range(count + 1)
        for table in tables:
            flat += table
            if len(table) < width:
                flat += [0] * (width - len(table))
        packed = torch.from_numpy(np.array(flat, dtype=np.int64))
        if self.device.type != "cpu":
            packed = packed.pin_memory().to(self.device, non_blocking=True)
        b = count
        return StepInput(
            input_ids=packed[:b],
            positions=packed[b : 2 * b],
            slot_mapping=packed[2 * b : 3 * b],
            context_lens=packed[3 * b : 4 * b].to(torch.int32),
            query_start_loc=packed[4 * b : 5 * b + 1].to(torch.int32),
            block_tables=packed[5 * b + 1 :].view(b, width).to(torch.int32),
            is_decode=True,
            max_context_len=max(positions) + 1,
            max_query_len=1,
        )

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        tensor = torch.tensor(values, dtype=dtype)
        if self.device.type == "cpu":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    # ------------------------------------------------------------------ forward

    def forward(self, step: StepInput) -> torch.Tensor:
        """Run one step; float32 logits ``[B, vocab]`` of the last new token of each request."""
        with torch.inference_mode():
            max_len = step.max_context_len if step.max_context_len >= 0 else int(step.context_lens.max())
            seq_lens = self._token_context_lens(step) if self.rope.cfg.rope_type == "dynamic" else None
            cos, sin = self.rope.rotation(step.positions, max_len - 1, seq_lens)
            hidden = F.embedding(step.input_ids, self.embed_tokens)
            for index, layer in enumerate(self.layers):
                hidden = self._decoder_layer(index, layer, hidden, cos, sin, step)
            if not step.is_decode:
                hidden = hidden[step.query_start_loc[1:].long() - 1]
            hidden = rms_norm(hidden, self.final_norm, self.eps)
            return F.linear(hidden, self.lm_head).float()

    __call__ = forward

    def _token_context_lens(self, step: StepInput) -> torch.Tensor:
        q_lens = (step.query_start_loc[1:] - step.query_start_loc[:-1]).long()
        return torch.repeat_interleave(step.context_lens.long(), q_lens, output_size=step.num_tokens)

    def _decoder_layer(
        self, index: int, w: LayerWeights, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        step: StepInput,
    ) -> torch.Tensor:
        x = rms_norm(hidden, w.input_norm, self.eps)
        hidden = hidden + self._attention(index, w, x, cos, sin, step)
        x = rms_norm(hidden, w.post_norm, self.eps)
        return hidden + self._mlp(w, x)

    def _attention(
        self, index: int, w: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        step: StepInput,
    ) -> torch.Tensor:
        q, k, v = self._qkv(w, x, cos, sin)
        k_cache, v_cache = self.k_caches[index], self.v_caches[index]
        backend = self.kernel_backend
        kernels.write_kv(k, v, k_cache, v_cache, step.slot_mapping, backend=backend)
        if step.is_decode:
            out = kernels.paged_decode_attention(
                q, k_cache, v_cache, step.block_tables, step.context_lens, self.scale, backend=backend,
                max_context_len=_known(step.max_context_len),
            )
        else:
            out = kernels.paged_prefill_attention(
                q, k_cache, v_cache, step.block_tables, step.query_start_loc, step.context_lens, self.scale,
                backend=backend, max_query_len=_known(step.max_query_len),
            )
        return F.linear(out.reshape(x.shape[0], self.num_heads * self.head_dim), w.o_proj, w.o_bias)

    def _qkv(
        self, w: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projected and rotated q ``[T, Hq, D]``, k and v ``[T, Hkv, D]``."""
        tokens, d = x.shape[0], self.head_dim
        q = apply_rotary(F.linear(x, w.q_proj, w.q_bias).view(tokens, self.num_heads, d), cos, sin)
        k = apply_rotary(F.linear(x, w.k_proj, w.k_bias).view(tokens, self.num_kv_heads, d), cos, sin)
        return q, k, F.linear(x, w.v_proj, w.v_bias).view(tokens, self.num_kv_heads, d)

    @staticmethod
    def _mlp(w: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        gate = F.silu(F.linear(x, w.gate_proj, w.gate_bias))
        return F.linear(gate * F.linear(x, w.up_proj, w.up_bias), w.down_proj, w.down_bias)
