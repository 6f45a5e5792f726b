"""What block sharing saves: parallel sampling and beam search with and without sharing, on real tensors.

Blocks in use are sampled after every engine step and averaged over steps (deterministic, unlike time
weights on a noisy machine). "Memory saved by sharing" follows the PagedAttention paper:
(blocks without sharing - blocks with sharing) / blocks without sharing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvbench.engine.beam import SHARING_MODES, BeamSearch
from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.kv.block_pool import OutOfBlocks, blocks_for
from kvbench.kv.contiguous import reservation_tokens
from kvbench.models.resolve import resolve_model
from kvbench.models.runner import ModelRunner
from kvbench.preflight import (
    check_context_length,
    check_kv_pool_for_device,
    check_requests_for_host,
    check_run_counts,
)
from kvbench.results.dataset_draw import DatasetDraw
from kvbench.results.run_meta import run_meta
from kvbench.results.share_result import ShareMeta, ShareResult, ShareRow, ShareSavings, WidthCost
from kvbench.studies.local_model import load_model, packed_weight_bytes
from kvbench.studies.run_requests import random_prompts
from kvbench.workload.dataset import TokenCounter, sample_dataset


@dataclass
class ShareMeasurement:
    mode: str  # paged-shared | paged-unshared (or paged-copy) | contiguous
    width: int  # n samples or beam width
    mean_blocks: float
    peak_blocks: int
    block_size: int
    bytes_per_token: int
    outputs: list[list[int]]

    def row(self, scenario: str) -> ShareRow:
        """The measurement as the summary's point of ``scenario``."""
        per_block = self.block_size * self.bytes_per_token
        return ShareRow(
            self.mode,
            self.width,
            self.mean_blocks,
            self.peak_blocks,
            self.mean_blocks * per_block,
            self.peak_blocks * per_block,
            scenario,
        )


def longest_prompt(mean_len: int) -> int:
    """The longest prompt :func:`make_prompts` can draw around ``mean_len`` (uniform +-50%)."""
    return mean_len + mean_len // 2


def make_prompts(count: int, mean_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """``count`` prompts of lengths around ``mean_len`` (uniform +-50%), seeded random token ids."""
    if count < 1 or mean_len < 1:
        raise KvbenchError("the number of prompts and their mean length must be at least 1")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, mean_len // 2), longest_prompt(mean_len) + 1, count)
    return [rng.integers(0, vocab_size, int(n)).tolist() for n in lengths]


def check_share_lengths(
    prompt_len: int, output_len: int, max_len: int, context_length: int | None = None, random_prompts: bool = True
) -> None:
    """Refuse, before the model loads or a prompt is drawn, requests longer than max-len.

    Every engine refuses a request whose prompt plus output exceeds max-len (itself held to the model's
    ``context_length``, max_position_embeddings); a prompt of a billion tokens would fill the host's memory before
    that. With
    ``random_prompts`` the prompts are drawn up to 1.5 x ``prompt_len``, so that longest one must fit; a
    dataset's prompts are cut to max-len - output-len when they are read, so only the output is checked.
    """
    if context_length is not None and max_len < context_length:
        raise_max_len = f"or raise max-len (the model's context is {context_length:,} tokens)"
    elif context_length is not None:
        raise_max_len = f"(max-len is already the model's context of {context_length:,} tokens)"
    else:
        raise_max_len = "or raise max-len"
    if output_len >= max_len:
        raise KvbenchError(
            f"an output length of {output_len:,} leaves no room for a prompt within max-len "
            f"{max_len:,}: lower the output length {raise_max_len}"
        )
    if not random_prompts:
        return
    longest = longest_prompt(prompt_len)
    if longest + output_len > max_len:
        room = max_len - output_len
        fit = 2 * room // 3 + 1
        while fit > 1 and longest_prompt(fit) > room:
            fit -= 1
        raise KvbenchError(
            f"a mean prompt length of {prompt_len:,} draws prompts of up to {longest:,} tokens "
            f"(+-50%), so a request needs up to {longest + output_len:,} tokens with an output length "
            f"of {output_len:,}, above max-len {max_len:,}: use a prompt length of {fit:,} or less, "
            f"a shorter output {raise_max_len}"
        )


def check_prompts_fit(prompts: Sequence[list[int]], output_len: int, max_len: int) -> None:
    """Every prompt plus its output fits max-len (beam search has no scheduler to refuse one)."""
    longest = max(map(len, prompts), default=0)
    if longest + output_len > max_len:
        raise KvbenchError(
            f"a prompt of {longest:,} tokens with an output length of {output_len:,} needs "
            f"{longest + output_len:,} tokens, above max-len {max_len:,}: use shorter prompts or "
            "outputs, or raise max-len"
        )


def check_pool_holds_copies(
    prompts: Sequence[list[int]], width: int, output_len: int, base: EngineConfig, kind: str
) -> None:
    """Refuse, before any work, a study whose copies the pool cannot hold at once.

    Without sharing, parallel sampling holds ``width`` private copies of every prompt (all at once), and beam
    search up to ``2 x width`` beams of one prompt (the new beams are derived before the old are freed).
    If they do not all fit, the unshared modes would queue or preempt and their memory would be capped by
    the pool: no comparison left, and a large width would run for minutes.
    """
    copies = width if kind == "parallel" else 2 * width
    lengths = [len(p) + output_len - 1 for p in prompts]
    per_prompt = [
        max(
            blocks_for(n, base.block_size),
            blocks_for(reservation_tokens(base.reserve, n, base.max_len), base.block_size),
        )
        for n in lengths
    ]
    needed = copies * (sum(per_prompt) if kind == "parallel" else max(per_prompt))
    if needed > base.num_blocks:
        what = f"{len(prompts)} prompt(s) x {width} samples" if kind == "parallel" else f"{copies} beams"
        raise KvbenchError(
            f"without sharing, {what} need {needed:,} KV blocks at once; the pool holds "
            f"{base.num_blocks:,}: give the pool more blocks, or lower the width, the number of "
            "prompts or their lengths"
        )


def _step_blocks(result) -> tuple[float, int]:
    blocks = [entry[1] for entry in result.accountant.timeline]
    return (float(np.mean(blocks)) if blocks else 0.0), (max(blocks) if blocks else 0)


def parallel_sampling(
    model,
    base: EngineConfig,
    prompts: Sequence[list[int]],
    n: int,
    output_len: int,
    seed: int,
    bytes_per_token: int,
    eos_token_id: int | None = None,
    stop_token_ids: Sequence[int] = (),
    stop_at_eos: bool = False,
) -> list[ShareMeasurement]:
    """n samples per prompt: paged with shared prompt blocks, paged with n private copies, contiguous copies.

    With ``stop_at_eos`` each sample ends at the model's EOS (at most ``output_len`` tokens); the seeded samples
    are the same in every mode, so each mode serves the same answers.
    """
    if n < 1:
        raise KvbenchError(f"samples per prompt must be at least 1, got {n}")

    def params(group: int, index: int) -> SamplingParams:
        return SamplingParams(
            temperature=1.0,
            top_p=0.95,
            seed=seed + 1000 * group + index,
            max_tokens=output_len,
            ignore_eos=not stop_at_eos,
        )

    measurements = []
    for mode in ("paged-shared", "paged-unshared", "contiguous"):
        manager, shared = SHARING_MODES[mode]
        engine = LLMEngine(model, replace(base, engine=manager), eos_token_id, stop_token_ids)
        if shared:  # one request forked into n samples
            requests = [make_request(g, p, params(g, 0), num_samples=n) for g, p in enumerate(prompts)]
            group_of = {r.request_id: r.request_id for r in requests}
        else:
            requests = [make_request(g * n + i, p, params(g, i)) for g, p in enumerate(prompts) for i in range(n)]
            for request in requests:
                request.sample_index = request.request_id % n
            group_of = {r.request_id: r.request_id // n for r in requests}
        result = engine.run(requests, len(requests))
        if result.rejected:
            reason = result.rejected[0].reject_reason
            raise KvbenchError(
                f"{mode}: {len(result.rejected)} request(s) rejected ({reason}); give the pool more "
                "blocks or raise max-len, or use shorter prompts"
            )
        mean, peak = _step_blocks(result)
        outputs = sorted(
            ((group_of[r.parent_id if r.parent_id is not None else r.request_id], r.sample_index), r.output_token_ids)
            for r in result.requests
        )
        measurements.append(
            ShareMeasurement(mode, n, mean, peak, base.block_size, bytes_per_token, [tokens for _, tokens in outputs])
        )
    return measurements


def beam_search(
    runner,
    base: EngineConfig,
    prompts: Sequence[list[int]],
    width: int,
    output_len: int,
    bytes_per_token: int,
    length_penalty: float = 1.0,
) -> list[ShareMeasurement]:
    """Beam width ``width`` per prompt (one prompt at a time) with shared, copied and contiguous beams."""
    if width < 1:
        raise KvbenchError(f"beam width must be at least 1, got {width}")
    measurements = []
    for mode in ("paged-shared", "paged-copy", "contiguous"):
        search = BeamSearch(runner, mode, reserve=base.reserve, max_len=base.max_len)
        steps: list[int] = []
        outputs: list[list[int]] = []
        for prompt in prompts:
            try:
                result = search.run(prompt, width, output_len, length_penalty)
            except OutOfBlocks:
                raise KvbenchError(
                    f"{mode}: {width} beams of {len(prompt) + output_len} tokens do not fit in the pool; "
                    "give the pool more blocks"
                ) from None
            steps += result.blocks_per_step
            outputs.append(result.sequences[0])
        measurements.append(
            ShareMeasurement(mode, width, float(np.mean(steps)), max(steps), base.block_size, bytes_per_token, outputs)
        )
    return measurements


def _saved(without: float, with_sharing: float) -> float | None:
    return 100 * (without - with_sharing) / without if without > 0 else None


def savings(measurements: list[ShareMeasurement], singles: list[ShareMeasurement]) -> ShareSavings:
    """Saved-by-sharing ratios and the cost of width w relative to width 1, per mode (mean blocks)."""
    by_mode = {m.mode: m for m in measurements}
    single = {m.mode: m for m in singles}
    shared = by_mode["paged-shared"]
    unshared = by_mode.get("paged-unshared") or by_mode["paged-copy"]
    costs = {}
    for mode, m in by_mode.items():
        base = single.get(mode)
        if base is not None and base.mean_blocks > 0:
            costs[mode] = WidthCost(m.mean_blocks / base.mean_blocks, m.peak_blocks / base.peak_blocks)
    return ShareSavings(
        _saved(unshared.mean_blocks, shared.mean_blocks), _saved(unshared.peak_blocks, shared.peak_blocks), costs
    )


ANCHORS = {
    "parallel": "article: n=5 costs 1.4x the memory of one sample instead of 5x; paper: sharing saves 6.1-9.8% "
    "(Alpaca), 16.2-30.5% (ShareGPT)",
    "beam": "article: beam width 4 costs 2.1x instead of 4x; paper: sharing saves 37.6-55.2% (Alpaca), "
    "44.3-66.3% (ShareGPT)",
}


@dataclass(frozen=True)
class ShareSettings:
    kind: str  # "parallel" (n samples per prompt) | "beam" (beam width)
    width: int
    prompts: int = 8
    prompt_len: int = 64
    output_len: int = 64
    block_size: int = 16
    reserve: str = "oracle"
    max_len: int = 2048
    num_blocks: int = 4096
    length_penalty: float = 1.0
    model: str = "tiny"
    device: str = "auto"
    seed: int = 0
    threads: int | None = None  # CPU intra-op threads; None: measured
    dataset: str | None = None  # prompts from a dataset instead of random token ids
    stop: str | None = None  # eos | length; None: eos for parallel sampling on a real model with a tokenizer


def share_prompts(settings: ShareSettings, loaded) -> tuple[list[list[int]], DatasetDraw | None]:
    """The prompts: drawn from a dataset (token ids with the model's tokenizer, random ids of its word counts
    without one), or random ids around ``prompt_len``; and the dataset's record for the summary."""
    if settings.dataset is None:
        return make_prompts(settings.prompts, settings.prompt_len, loaded.shape.vocab_size, settings.seed), None
    sample = sample_dataset(
        settings.dataset,
        TokenCounter(loaded.tokenizer, settings.model),
        settings.max_len - settings.output_len,
        settings.prompts,
        settings.seed,
        need_output=False,
    )
    if loaded.tokenizer is None:
        ids = random_prompts(sample.pairs, loaded.shape.vocab_size, settings.seed)
    else:  # a tokenizer encodes every prompt
        ids = [r.prompt_token_ids for r in sample.requests if r.prompt_token_ids is not None]
        assert len(ids) == len(sample.requests)
    return ids, DatasetDraw.from_json(sample.as_dict())


def share_stop(settings: ShareSettings, loaded) -> str:
    """eos only for parallel sampling (beams run to their length); by default when the model can decide."""
    stop = settings.stop or ("eos" if settings.kind == "parallel" and loaded.can_stop_at_eos else "length")
    if stop == "eos" and settings.kind == "beam":
        raise KvbenchError(
            "beam search runs every beam to its output length: stopping at EOS applies to parallel sampling"
        )
    if stop == "eos" and not loaded.stop_token_ids:
        raise KvbenchError(f"stopping at EOS needs a model that has an EOS token; {loaded.shape.name} has none")
    return stop


def run_share_study(settings: ShareSettings, progress=None) -> ShareResult:
    """Width ``w`` and width 1 in every mode; the summary document (``kind: share``)."""
    kind, width, seed = settings.kind, settings.width, settings.seed
    check_run_counts(
        prompts=settings.prompts, samples=width, block_size=settings.block_size, num_blocks=settings.num_blocks
    )
    shape = resolve_model(settings.model)  # its config only: the lengths are refused before any weight loads
    check_context_length(shape, settings.max_len)
    check_share_lengths(
        settings.prompt_len,
        settings.output_len,
        settings.max_len,
        shape.context_length,
        random_prompts=settings.dataset is None,
    )
    config = EngineConfig(
        block_size=settings.block_size,
        num_blocks=settings.num_blocks,
        reserve=settings.reserve,
        max_len=settings.max_len,
    )
    loaded = load_model(settings.model, settings.device, None, seed, max_len=settings.max_len, threads=settings.threads)
    # parallel sampling builds each mode's engine before the last one is freed: two pools at once
    check_kv_pool_for_device(
        loaded.shape,
        loaded.device,
        settings.num_blocks,
        settings.block_size,
        pools=2 if kind == "parallel" else 1,
        extra_weights=packed_weight_bytes(loaded),
    )
    texts, dataset = share_prompts(settings, loaded)
    stop = share_stop(settings, loaded)
    check_prompts_fit(texts, settings.output_len, settings.max_len)
    check_requests_for_host(
        settings.prompts * width, sum(map(len, texts)), settings.prompts * width * settings.output_len
    )
    check_pool_holds_copies(texts, width, settings.output_len, config, kind)
    bpt = loaded.shape.bytes_per_token
    if progress is not None:
        progress(f"measuring {kind} width {width} and width 1...")
    if kind == "parallel":

        def measure(w: int) -> list[ShareMeasurement]:
            return parallel_sampling(
                loaded.model,
                config,
                texts,
                w,
                settings.output_len,
                seed,
                bpt,
                loaded.eos_token_id,
                loaded.stop_token_ids,
                stop_at_eos=stop == "eos",
            )
    else:
        runner = ModelRunner(loaded.model, settings.num_blocks, settings.block_size)

        def measure(w: int) -> list[ShareMeasurement]:
            return beam_search(runner, config, texts, w, settings.output_len, bpt, settings.length_penalty)

    measured = measure(width)
    singles = measured if width == 1 else measure(1)
    reported = measured if width == 1 else measured + singles  # width 1 is its own baseline: one point per mode
    points = [m.row(f"share-{kind}") for m in reported]
    meta = ShareMeta.from_json(
        run_meta(
            kind=kind,
            width=width,
            prompts=settings.prompts,
            prompt_len=settings.prompt_len,
            output_len=settings.output_len,
            block_size=settings.block_size,
            reserve=settings.reserve,
            model_name=loaded.shape.name,
            device=str(loaded.device),
            seed=seed,
            anchors=ANCHORS[kind],
            model_shape=loaded.shape.to_dict(),
            outputs_identical_with_and_without_sharing=measured[0].outputs == measured[1].outputs,
            threads=loaded.threads.as_dict() if loaded.threads else None,
            cpu_matmuls=loaded.matmul_plan.as_dict() if loaded.matmul_plan else None,
            stop=stop,
            dataset=dataset.to_json() if dataset else None,
            output_len_mean=float(np.mean([len(o) for o in measured[0].outputs])),
            prompt_len_mean=float(np.mean([len(t) for t in texts])),
        )
    )
    return ShareResult(meta, savings(measured, singles), points)
