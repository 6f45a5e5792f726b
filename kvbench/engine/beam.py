"""Beam search over the block pool, with shared (paged, copy-on-write) or copied (baseline) beams.

Selection follows the usual fixed-length beam search (as transformers does without an EOS token): at each
step every live beam's log-probabilities are added to its score, the best ``2k`` continuations over all
beams are ranked, the best ``k`` continue; after the last token the best ``k`` are the finished hypotheses,
scored ``sum of log-probs / generated_length ** length_penalty``.

Memory is where the strategies differ. ``paged-shared``: a new beam forks its parent's block table (ref
counts) and copies only the partly filled last block when it first writes there. ``paged-copy``: every new
beam gets private blocks and a full copy of its parent's. ``contiguous``: every new beam gets a new slab
(reserved up front by policy) holding a full copy. Blocks in use are recorded after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.errors import KvbenchError
from kvbench.kv.factory import build_manager, manager_class
from kvbench.kv.manager import BlockCopy, KVManager, assert_drained
from kvbench.models.runner import ModelRunner
from kvbench.models.sampler import beam_candidates, rank_finished

BEAM_MODES = ("paged-shared", "paged-copy", "contiguous")
# the KV manager each sharing mode runs on (beam search here, parallel sampling in studies.share), and whether
# its children share their parent's blocks (forked) or get their own copies
SHARING_MODES: dict[str, tuple[str, bool]] = {
    "paged-shared": ("paged", True),
    "paged-copy": ("paged", False),
    "paged-unshared": ("paged", False),
    "contiguous": ("contiguous", False),
}


@dataclass
class BeamSearchResult:
    sequences: list[list[int]]  # generated tokens of the k final beams, best first
    scores: list[float]  # length-penalised scores, best first
    blocks_per_step: list[int] = field(default_factory=list)  # blocks in use after each step
    block_size: int = 16
    copies: int = 0  # blocks copied (copy-on-write or full copies)

    @property
    def peak_blocks(self) -> int:
        return max(self.blocks_per_step, default=0)

    @property
    def mean_blocks(self) -> float:
        return sum(self.blocks_per_step) / len(self.blocks_per_step) if self.blocks_per_step else 0.0


class BeamSearch:
    """Beam search for one prompt at a time on a runner's KV pool; every block is freed afterwards."""

    def __init__(
        self, runner: ModelRunner, mode: str = "paged-shared", reserve: str = "oracle", max_len: int = 2048
    ) -> None:
        if mode not in BEAM_MODES:
            raise KvbenchError(f"unknown beam mode {mode!r}; choose one of {', '.join(BEAM_MODES)}")
        self.runner = runner
        self.mode = mode
        self.manager_kind, self.shared = SHARING_MODES[mode]
        if self.shared and not manager_class(self.manager_kind).can_fork:
            raise KvbenchError(f"beam mode {mode!r} shares blocks, which the {self.manager_kind} manager cannot")
        self.reserve = reserve
        self.max_len = max_len
        self._next_id = 0

    def run(
        self, prompt: list[int], num_beams: int, max_new_tokens: int, length_penalty: float = 1.0
    ) -> BeamSearchResult:
        if num_beams < 1 or max_new_tokens < 1:
            raise KvbenchError("beam width and max new tokens must be at least 1")
        if 2 * num_beams > self.runner.vocab_size:
            raise KvbenchError(f"beam width {num_beams} needs a vocabulary of at least {2 * num_beams} tokens")
        manager = build_manager(
            self.manager_kind, self.runner.num_blocks, self.runner.block_size, self.reserve, self.max_len
        )
        final_len = len(prompt) + max_new_tokens - 1
        result = BeamSearchResult([], [], block_size=manager.block_size)
        try:
            beams = self._search(manager, prompt, num_beams, max_new_tokens, length_penalty, final_len, result)
        finally:
            for seq_id in manager.live_ids():
                manager.free(seq_id)
        assert_drained(manager, "beam search")
        result.sequences, result.scores = beams
        return result

    # -- search -----------------------------------------------------------------------------------------
    def _search(self, manager: KVManager, prompt, k, steps, length_penalty, final_len, result):
        root = self._new_id()
        manager.allocate(root, len(prompt), final_len)
        logits = self.runner.forward(self.runner.build_step([(list(prompt), 0, manager.block_table(root))]))
        beam_tokens: list[list[int]] = [[]]
        beam_ids, beam_scores = [root], [0.0]  # the k initial beams are identical: one row
        result.blocks_per_step.append(manager.pool.num_used)
        for step in range(steps):
            top_scores, parents, tokens = beam_candidates(logits, beam_scores, 2 * k)
            if step == steps - 1:  # last token: the best k continuations are the finished hypotheses
                ranked = rank_finished(top_scores[:k], steps**length_penalty, k)
                return ([beam_tokens[parents[i]] + [tokens[i]] for i, _ in ranked], [score for _, score in ranked])
            keep = range(k)  # candidates come best first: the first k continue
            new_ids = [self._derive(manager, beam_ids[parents[i]], final_len, result) for i in keep]
            for old in beam_ids:
                manager.free(old)
            beam_tokens = [beam_tokens[parents[i]] + [tokens[i]] for i in keep]
            beam_scores = [top_scores[i] for i in keep]
            beam_ids = new_ids
            length = len(prompt) + step  # tokens cached per beam before this step's write
            chunks = []
            for seq_id, generated in zip(beam_ids, beam_tokens, strict=True):
                self._copy(manager.ensure_capacity(seq_id, length + 1), result)
                chunks.append(([generated[-1]], length, manager.block_table(seq_id)))
            logits = self.runner.forward(self.runner.build_step(chunks))
            result.blocks_per_step.append(manager.pool.num_used)
        raise AssertionError("unreachable")

    def _derive(self, manager: KVManager, parent: int, final_len: int, result: BeamSearchResult) -> int:
        """A new beam continuing ``parent``: shared blocks (paged-shared) or a full private copy."""
        child = self._new_id()
        if self.shared:
            manager.fork(parent, child)
            return child
        length = manager.lengths[parent]
        manager.allocate(child, length, final_len)
        src = manager.block_table(parent)[: -(-length // manager.block_size)]
        dst = manager.block_table(child)[: len(src)]
        self._copy([BlockCopy(a, b) for a, b in zip(src, dst, strict=True)], result)
        return child

    def _copy(self, copies: list[BlockCopy], result: BeamSearchResult) -> None:
        self.runner.copy_blocks(copies)
        result.copies += len(copies)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id
