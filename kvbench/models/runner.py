"""The model runner: a Llama-family forward pass over a paged KV pool, weights read from a ``transformers`` model.

One :meth:`ModelRunner.forward` call runs one engine step: the new tokens of all scheduled requests are
packed into ``[T, hidden]``; every linear layer runs once on the pack; per layer the new K/V are scattered
into their slots (``write_kv``) and attention reads each request's context through its block table
(``paged_decode_attention`` when every request brings one token, ``paged_prefill_attention`` otherwise, which
also covers a chunk after cached context: recompute after preemption, shared prefixes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kvbench import kernels
from kvbench.cpu import cpu_choices, cpu_heap, cpu_linear, decode_prefetch
from kvbench.kernels import cpu_native
from kvbench.kv.manager import BlockCopy
from kvbench.models import sampler
from kvbench.models.rope import RotaryEmbedding, apply_rotary, rope_config_from_hf
from kvbench.models.sampler import SamplingSettings

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
    attention_plan: Any = None  # the torch kernels' plan when the caller keeps one up to date; None: planned here
    kept_plan: Any = None  # a persistent decode input's plan, valid while the batch fits one chunk

    @property
    def num_requests(self) -> int:
        return self.context_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


@dataclass
class LayerWeights:
    """One decoder layer's weights, q/k/v and gate/up fused row-wise so that each is one matmul.

    The fused matrices are the model's own storage: after fusing, the ``transformers`` parameters are
    re-pointed at row slices of them (same values, no second copy of the weights), so ``generate()`` on the
    same model keeps working and a second runner over that model finds the rows already adjacent.
    """

    input_norm: torch.Tensor
    qkv_proj: torch.Tensor  # [(Hq + 2 Hkv) * D, hidden]
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up_proj: torch.Tensor  # [2 * intermediate, hidden]
    down_proj: torch.Tensor
    qkv_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    gate_up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    @classmethod
    def from_hf(cls, layer: Any) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp

        def bias(module: Any) -> torch.Tensor | None:
            return module.bias.data if module.bias is not None else None

        return cls(
            input_norm=layer.input_layernorm.weight.data,
            qkv_proj=fuse_rows([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
            o_proj=attn.o_proj.weight.data,
            post_norm=layer.post_attention_layernorm.weight.data,
            gate_up_proj=fuse_rows([mlp.gate_proj.weight, mlp.up_proj.weight]),
            down_proj=mlp.down_proj.weight.data,
            qkv_bias=_fused_bias([attn.q_proj, attn.k_proj, attn.v_proj]),
            o_bias=bias(attn.o_proj),
            gate_up_bias=_fused_bias([mlp.gate_proj, mlp.up_proj]),
            down_bias=bias(mlp.down_proj),
        )


def _adjacent_rows(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """``tensors`` as one tensor without a copy when they already lie back to back in one storage."""
    first = tensors[0]
    offset = first.storage_offset()
    for tensor in tensors:
        if (
            not tensor.is_contiguous()
            or tensor.shape[1:] != first.shape[1:]
            or tensor.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or tensor.storage_offset() != offset
        ):
            return None
        offset += tensor.numel()
    rows = sum(tensor.shape[0] for tensor in tensors)
    return first.as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def fuse_rows(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """One tensor holding ``params`` stacked along dim 0; each parameter becomes a view of its rows."""
    tensors = [param.data for param in params]
    fused = _adjacent_rows(tensors)
    if fused is not None:
        return fused
    fused = torch.cat(tensors, dim=0)
    start = 0
    for param, tensor in zip(params, tensors, strict=True):
        param.data = fused[start : start + tensor.shape[0]]
        start += tensor.shape[0]
    return fused


def _fused_bias(modules: list[Any]) -> torch.Tensor | None:
    """The modules' biases fused like their weights; zeros stand in for a missing one (None if all are)."""
    if all(module.bias is None for module in modules):
        return None
    for module in modules:
        if module.bias is None:
            weight = module.weight
            module.bias = torch.nn.Parameter(
                torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device), requires_grad=False
            )
    return fuse_rows([module.bias for module in modules])


LAYER_MATMULS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def matmul_weights(model: Any) -> dict[str, torch.Tensor]:
    """The tensors a runner multiplies, by role: the first layer's (q/k/v and gate/up fused, as the runner fuses
    them: the model's own storage) and the lm_head; what :mod:`kvbench.cpu.cpu_choices` measures."""
    layer = LayerWeights.from_hf(model.model.layers[0])
    return {**{role: getattr(layer, role) for role in LAYER_MATMULS}, "lm_head": model.lm_head.weight.data}


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


EXACT_ROWS = 32  # steps of up to this many rows multiply at their own row count
DECODE_ROWS = 64  # up to here (decode batches), an even row count; above (prefills), one of 8 per power of two


def matmul_rows(rows: int) -> int:
    """The row count a step of ``rows`` tokens multiplies a oneDNN-packed weight at: ``rows`` up to
    :data:`EXACT_ROWS`; up to :data:`DECODE_ROWS` rounded up to an even count (at most 3% padding); above, to one of
    eight per power of two (at most 12.5%).

    oneDNN (and torch's ideep layer over it) builds and caches a primitive for every row count it meets: 0.4-0.9
    ms to build on a small weight, against about 50 us for a cached call, and 430-720 KiB of memory each
    (measured: 200 row counts x 5 weights grew the process by 535 MiB). Unrounded, nearly every prefill step
    met new ones (the engine that ran a point first paid for them, and the caches held up to 1,024 of them);
    rounded, the main job meets 10-45 row counts per weight (counted). A decode batch is the exception: it keeps its row
    count for many steps, and on a 1B model it is bound by arithmetic, not by reading the weights, so padding costs
    what it adds (TinyLlama's gate/up projection on a Zen 4: 12.6 ms at 50 rows, 13.8 ms padded to 56, as the
    coarser steps this replaced did).
    """
    if rows <= EXACT_ROWS:
        return rows
    if rows <= DECODE_ROWS:
        return rows + rows % 2
    step = 1 << (rows.bit_length() - 4)  # 65-127 rows: steps of 8; 128-255: 16
    return -(-rows // step) * step


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
        packed_weights: bool | None = None,
    ) -> None:
        """Keep references to ``model``'s parameters; allocate ``num_blocks`` blocks of ``block_size`` slots.

        ``kv_dtype`` defaults to the model's dtype; ``kernel_backend`` ("torch" | "triton") overrides the
        kernels' choice by device (and ``KVBENCH_KERNEL_BACKEND``, read here once rather than per kernel call).
        ``packed_weights`` (None: wherever oneDNN can, see :mod:`kvbench.cpu.cpu_linear`) packs the layer and
        lm_head weights once for the CPU's matmuls.
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
        self.kernel_backend = kernels.resolve_backend(self.device, kernel_backend)  # once, not per kernel call
        # a step's freed activations stay in the heap for the next (else each large one is faulted in afresh)
        self.heap_policy = cpu_heap.keep_freed_memory() if self.device.type == "cpu" else None
        if self.kernel_backend == "native" and (
            self.kv_dtype not in cpu_native.KERNEL_DTYPES or self.kv_dtype != self.dtype
        ):
            self.kernel_backend = "torch"  # not a pool the C decode kernel takes: keep the reference's kept plans
        # how the C decode attention prefetches K/V rows: measured on this CPU for this KV shape, once per model
        self.decode_prefetch = (
            decode_prefetch.choice_for(model, block_size, self.kv_dtype)
            if decode_prefetch.applies(self.device, self.kernel_backend, self.kv_dtype)
            else None
        )
        self._prefetch = self.decode_prefetch.prefetch if self.decode_prefetch else cpu_native.DEFAULT_PREFETCH
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.vocab_size = config.vocab_size
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self._read_weights(model)
        self.packed_weights = False
        self.matmul_plan: cpu_choices.MatmulPlan | None = None
        if cpu_linear.packing_available(self.device, self.dtype) if packed_weights is None else packed_weights:
            self._pack_weights(model)
        self.rope = RotaryEmbedding(rope_config_from_hf(config), self.device, self.dtype)
        # with the native backend, norms, SiLU-and-multiply and rotary as single-pass C ops too (float32 or bfloat16
        # on one CPU thread); otherwise torch's
        self.native_ops = self.kernel_backend == "native" and cpu_native.use_for_model_ops(
            self.device, self.dtype, self.head_dim
        )
        self.k_caches, self.v_caches = self._allocate_kv_pool()

    # ------------------------------------------------------------------ setup

    def _read_weights(self, model: Any) -> None:
        backbone = model.model
        self.embed_tokens = backbone.embed_tokens.weight.data
        self.final_norm = backbone.norm.weight.data
        self.lm_head = model.lm_head.weight.data
        self.layers = [LayerWeights.from_hf(layer) for layer in backbone.layers]

    def _pack_weights(self, model: Any) -> None:
        """Each matmul weight with the packed copy and the row ranges this CPU's measured plan chose for its role
        (:mod:`kvbench.cpu.cpu_choices`; the model's own tensors stay as they are)."""
        plan = cpu_choices.plan_for(
            model, {**{role: getattr(self.layers[0], role) for role in LAYER_MATMULS}, "lm_head": self.lm_head}
        )
        for layer in self.layers:
            for role in LAYER_MATMULS:
                setattr(layer, role, cpu_linear.pack_for(model, getattr(layer, role), plan.choice(role).routes()))
        self.lm_head = cpu_linear.pack_for(model, self.lm_head, plan.choice("lm_head").routes())
        self.matmul_plan = plan
        self.packed_weights = True

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

    def decode_step_input(
        self, longs: np.ndarray, ints: np.ndarray, count: int, width: int, max_context_len: int
    ) -> StepInput:
        """A decode step from its two packed host arrays (taken over, not copied).

        ``longs`` (int64) holds tokens, positions and slots; ``ints`` (int32) holds context lengths, query
        starts ``0..count`` and the block tables ``[count, width]`` padded with block 0.
        """
        wide = torch.from_numpy(longs)
        narrow = torch.from_numpy(ints)
        if self.device.type != "cpu":
            wide = wide.pin_memory().to(self.device, non_blocking=True)
            narrow = narrow.pin_memory().to(self.device, non_blocking=True)
        b = count
        return StepInput(
            input_ids=wide[:b],
            positions=wide[b : 2 * b],
            slot_mapping=wide[2 * b :],
            context_lens=narrow[:b],
            query_start_loc=narrow[b : 2 * b + 1],
            block_tables=narrow[2 * b + 1 :].view(b, width),
            is_decode=True,
            max_context_len=max_context_len,
            max_query_len=1,
        )

    @property
    def keeps_decode_plan(self) -> bool:
        """Whether a persistent decode input can keep the attention plan by viewing its host arrays (CPU,
        torch kernels): the caller then maintains a softmax bias ``[B, W * block_size]`` (0 visible, -inf not)."""
        return self.device.type == "cpu" and self.kernel_backend == "torch"

    def keeps_plan_for(self, context_lens: list[int]) -> bool:
        """Whether a kept (one-bucket) plan suits a batch of these context lengths; when lengths differ
        much, each step is planned in length buckets instead, so padding does not multiply the work."""
        return self.keeps_decode_plan and kernels.decode_padding_is_small(context_lens, self.block_size)

    def persistent_decode_input(
        self,
        longs: np.ndarray,
        ints: np.ndarray,
        count: int,
        width: int,
        max_context_len: int,
        bias: np.ndarray | None = None,
    ) -> StepInput:
        """A decode step over host arrays the caller keeps and advances in place between steps.

        On the CPU the tensors view the arrays (no copy per step), and with ``bias`` (see
        ``keeps_decode_plan``) the torch kernels' plan views the table rows and the bias too, so advancing
        the arrays keeps it current. Call :meth:`refresh_decode_input` before each step.
        """
        if self.device.type != "cpu":
            return self.decode_step_input(longs.copy(), ints.copy(), count, width, max_context_len)
        step = self.decode_step_input(longs, ints, count, width, max_context_len)
        if bias is not None and self.keeps_decode_plan:
            rows = torch.from_numpy(ints[2 * count + 1 :])  # the table rows, a view: patched rows show through
            step.kept_plan = kernels.kept_decode_plan(rows, torch.from_numpy(bias), count)
        return self.refresh_decode_input(step, max_context_len)

    def refresh_decode_input(self, step: StepInput, max_context_len: int) -> StepInput:
        """The persistent step for its next use: the longest context now, and the kept plan while the batch
        fits in one chunk of the torch kernels (else the runner plans the step itself)."""
        step.max_context_len = max_context_len
        fits = step.kept_plan is not None and kernels.decode_plan_fits(
            step.kept_plan, max_context_len, self.num_kv_heads * self.head_dim
        )
        step.attention_plan = step.kept_plan if fits else None
        return step

    def copy_blocks(self, copies: Sequence[BlockCopy]) -> None:
        """Copy whole blocks of every layer's K and V (copy-on-write, or a beam's private copy)."""
        if not copies:
            return
        src = torch.tensor([c.src for c in copies], device=self.device)
        dst = torch.tensor([c.dst for c in copies], device=self.device)
        kernels.copy_blocks(self.k_caches, self.v_caches, src, dst, backend=self.kernel_backend)

    # ------------------------------------------------------------------ sampling

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingSettings],
        generators: Sequence[torch.Generator | None],
        rows: Sequence[int] | None = None,
    ) -> list[int]:
        """Token ids chosen from ``logits`` (see :func:`kvbench.models.sampler.sample`)."""
        return sampler.sample(logits, params, generators, rows)

    @staticmethod
    def new_generator(seed: int | None) -> torch.Generator:
        """A request's own random stream (on the CPU, so draws are the same on every device)."""
        return sampler.make_generator(seed)

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        numpy_dtype = np.int64 if dtype == torch.int64 else np.int32
        tensor = torch.from_numpy(np.array(values, dtype=numpy_dtype))  # far faster than torch.tensor(list)
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
            plan = self._attention_plan(step)
            x = self._norm(hidden, self.layers[0].input_norm)
            for index, layer in enumerate(self.layers):
                # the residual stream: each block's output is added to hidden, whose norm feeds the next block
                hidden, x = self._add_norm(
                    hidden, self._attention(index, layer, x, cos, sin, step, plan), layer.post_norm
                )
                following = self.layers[index + 1].input_norm if index + 1 < len(self.layers) else self.final_norm
                hidden, x = self._add_norm(hidden, self._mlp(layer, x), following)
            if not step.is_decode:
                x = x[step.query_start_loc[1:].long() - 1]  # only the last token of each request samples
            return self._linear(x, self.lm_head).float()

    __call__ = forward

    def _attention_plan(self, step: StepInput) -> Any:
        """What every layer's attention of this step shares (the torch kernels' gathers and masks)."""
        if step.attention_plan is not None:
            return step.attention_plan
        if step.is_decode:
            return kernels.plan_decode(
                step.block_tables, step.context_lens, self.k_caches[0], backend=self.kernel_backend, valid_tables=True
            )  # padded with block 0
        return kernels.plan_prefill(
            step.block_tables,
            step.query_start_loc,
            step.context_lens,
            self.k_caches[0],
            self.num_heads,
            backend=self.kernel_backend,
        )

    @staticmethod
    def _linear(x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T + bias``; where the step's row count takes oneDNN's packed copy, ``x`` is padded to
        :func:`matmul_rows` rows (oneDNN builds a primitive per row count it meets)."""
        rows = x.shape[0]
        if cpu_linear.path_at(weight, rows) == cpu_linear.ONEDNN:
            padded = matmul_rows(rows)
            if padded != rows:
                return cpu_linear.linear(F.pad(x, (0, 0, 0, padded - rows)), weight, bias)[:rows]
        return cpu_linear.linear(x, weight, bias)

    def _token_context_lens(self, step: StepInput) -> torch.Tensor:
        q_lens = (step.query_start_loc[1:] - step.query_start_loc[:-1]).long()
        return torch.repeat_interleave(step.context_lens.long(), q_lens, output_size=step.num_tokens)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.native_ops:
            return cpu_native.rms_norm(x, weight, self.eps)
        return rms_norm(x, weight, self.eps)

    def _add_norm(
        self, hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden + delta`` and its RMSNorm (with the C ops: one pass, ``hidden`` updated in place)."""
        if self.native_ops:
            return hidden, cpu_native.add_rms_norm_(hidden, delta.contiguous(), weight, self.eps)
        hidden = hidden + delta
        return hidden, rms_norm(hidden, weight, self.eps)

    def _attention(
        self,
        index: int,
        w: LayerWeights,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        step: StepInput,
        plan: Any,
    ) -> torch.Tensor:
        q, k, v = self._qkv(w, x, cos, sin)
        k_cache, v_cache = self.k_caches[index], self.v_caches[index]
        backend = self.kernel_backend
        kernels.write_kv(k, v, k_cache, v_cache, step.slot_mapping, backend=backend, padded=False)
        if step.is_decode:
            out = kernels.paged_decode_attention(
                q,
                k_cache,
                v_cache,
                step.block_tables,
                step.context_lens,
                self.scale,
                backend=backend,
                max_context_len=_known(step.max_context_len),
                plan=plan,
                prefetch=self._prefetch,
            )
        else:
            out = kernels.paged_prefill_attention(
                q,
                k_cache,
                v_cache,
                step.block_tables,
                step.query_start_loc,
                step.context_lens,
                self.scale,
                backend=backend,
                max_query_len=_known(step.max_query_len),
                plan=plan,
            )
        return self._linear(out.reshape(x.shape[0], self.num_heads * self.head_dim), w.o_proj, w.o_bias)

    def _qkv(
        self, w: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projected and rotated q ``[T, Hq, D]``, k and v ``[T, Hkv, D]`` (views of one fused projection)."""
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self._linear(x, w.qkv_proj, w.qkv_bias).view(x.shape[0], heads + 2 * kv_heads, self.head_dim)
        if self.native_ops:
            qkv = qkv.contiguous()
            cpu_native.rotary_(qkv, heads + kv_heads, cos, sin)  # q and k rotated in place
            return qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
        qk = apply_rotary(qkv[:, : heads + kv_heads], cos, sin)  # q and k rotated in one pass
        return qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]

    def _mlp(self, w: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        gate_up = self._linear(x, w.gate_up_proj, w.gate_up_bias)
        if self.native_ops:
            return self._linear(cpu_native.silu_and_mul(gate_up.contiguous()), w.down_proj, w.down_bias)
        gate, up = gate_up.chunk(2, dim=-1)
        return self._linear(F.silu(gate) * up, w.down_proj, w.down_bias)
