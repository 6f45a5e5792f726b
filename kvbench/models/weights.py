"""A model's weights as groups of identical tensors, each with a role that says how it is stored and split.

The role decides two things a deployment needs: whether a weight-only quantization method stores it quantized
(:data:`QUANTIZABLE_ROLES`: the matrices of the decoder layers, never embeddings, norms or routers), and how
tensor parallelism splits it across GPUs (:data:`TP_SPLIT`): over attention heads or the MLP width, over the
KV heads (replicated once tensor parallelism exceeds them), or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass

# role -> how tensor parallelism divides it: "tp" (an equal share per GPU), "kv" (by KV heads; a GPU keeps
# one whole head once there are more GPUs than heads) or "none" (every GPU holds a full copy)
TP_SPLIT = {
    "embed": "tp",  # vocabulary-parallel
    "lm_head": "tp",
    "position": "none",  # OPT's learned positions
    "attn_q": "tp",
    "attn_kv": "kv",
    "attn_o": "tp",
    "mla_down": "none",  # multi-head latent attention: the shared down projections (q_a, kv_a) are replicated
    "mla_up": "tp",  # q_b, kv_b: split by heads
    "sink": "tp",  # one attention-sink logit per head (gpt-oss)
    "mlp": "tp",
    "expert": "tp",  # tensor or expert parallel: each GPU holds 1/N of the experts' weights either way
    "shared_expert": "tp",
    "router": "none",
    "norm": "none",
    "bias": "none",
    "vision": "none",  # a vision tower and its projector, counted whole on every GPU (an upper bound)
}
QUANTIZABLE_ROLES = frozenset({"attn_q", "attn_kv", "attn_o", "mla_down", "mla_up", "mlp", "expert", "shared_expert"})


@dataclass(frozen=True)
class WeightGroup:
    """``count`` tensors of ``rows x cols`` (a matrix: output x input features) or of ``cols`` (a vector)."""

    role: str
    rows: int
    cols: int
    count: int = 1
    matrix: bool = True

    def __post_init__(self) -> None:
        if self.role not in TP_SPLIT:
            raise ValueError(f"unknown weight role {self.role!r}")

    @property
    def numel(self) -> int:
        """Elements of one tensor."""
        return self.rows * self.cols if self.matrix else self.cols

    @property
    def parameters(self) -> int:
        return self.numel * self.count

    @property
    def quantizable(self) -> bool:
        return self.matrix and self.role in QUANTIZABLE_ROLES


def vector(role: str, length: int, count: int = 1) -> WeightGroup:
    return WeightGroup(role, 1, length, count, matrix=False)


def total_parameters(groups: list[WeightGroup]) -> int:
    return sum(group.parameters for group in groups)
