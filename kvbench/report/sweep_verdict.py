"""The sweep's answer in words, written once: the console, summary.md, summary.json's ``findings`` and the page's
verdict all show :func:`sweep_verdict`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.results.article import REFERENCE_ENGINES, ArticleRow
from kvbench.results.point import Point
from kvbench.results.run_meta import RunMeta
from kvbench.units import human_bytes, pct, tok_s
from kvbench.values import is_positive

Pair = tuple[int, Point, Point]  # (concurrency, paged point, contiguous point)
REFERENCE_CAPTION = (
    "vLLM: its own kernels, scheduler and memory manager on the same requests, closed loop, "
    "warm-up and KV budget: a reference, not a controlled A/B"
)


@dataclass(frozen=True)
class SweepVerdict:
    headline: str
    tone: str  # good | warn | bad | neutral: how the page colours it
    sentences: list[str]

    @property
    def lines(self) -> list[str]:
        """summary.json's ``findings``: the headline, then the sentences."""
        return [self.headline, *self.sentences]


def points_by_key(points: Sequence[Point]) -> dict[tuple[str, int], Point]:
    """The points by (engine, concurrency)."""
    return {(p.engine, p.concurrency): p for p in points}


EQUAL_WITHIN = 0.10  # a single run's paged/contiguous TPS ratio varies about this much on a shared CPU
BUSY_SHARE = 0.8  # the engines had a core for less of their steps' wall time than this: the machine was busy


def _equal_batch_finding(equal: list[Pair], simulated: bool, threads: float = 1) -> str:
    where = ", ".join(f"C={c}" for c, _, _ in equal)
    ratios = [paged.output_throughput / contiguous.output_throughput for _, paged, contiguous in equal]
    spreads = [(p.ci95("output_throughput"), c.ci95("output_throughput")) for _, p, c in equal]
    per_cpu = [(per_cpu_second(p), per_cpu_second(c)) for _, p, c in equal]
    cpu = [a / b for a, b in per_cpu if a and b] if all(a and b for a, b in per_cpu) else None
    shares = [(p.cpu_time_s or 0) / (p.duration * threads) for _, *pair in equal for p in pair] if cpu else []
    busy = bool(shares) and min(shares) < BUSY_SHARE
    sentences = [
        f"At equal batch ({where}) both engines held the same requests.",
        f"Paged ran at {_listed(ratios)} contiguous's speed.",
    ]
    if simulated:
        sentences.append(
            "That is equal by construction: the simulator gives both the same steps and roofline step times."
            if all(abs(r - 1) < 1e-9 for r in ratios)
            else "That is as the simulator's step times give it."
        )
    elif all(a is not None and b is not None for a, b in spreads):
        apart = [
            abs(p.output_throughput - c.output_throughput) > (a or 0) + (b or 0)
            for (_, p, c), (a, b) in zip(equal, spreads, strict=True)
        ]
        sentences.append(
            "That is equal: the 95% confidence intervals overlap."
            if not any(apart)
            else "They differ where the 95% confidence intervals do not overlap: "
            + ", ".join(f"C={c}" for (c, _, _), a in zip(equal, apart, strict=True) if a)
            + "."
        )
    else:
        judged = ratios
        if busy:
            assert cpu is not None  # busy is read from the CPU times
            judged = cpu
            sentences += [
                f"The machine was busy: the engines had a core for {100 * min(shares):.0f}% of their steps' wall "
                "time at the least, and the waiting falls unevenly.",
                f"Per CPU-second of their steps, paged did {_listed(cpu)} contiguous's work.",
            ]
        sentences.append(
            f"That is equal within the ±{100 * EQUAL_WITHIN:.0f}% one run varies by on a shared machine; "
            "repeated points give confidence intervals."
            if all(abs(r - 1) <= EQUAL_WITHIN for r in judged)
            else f"That is not equal within ±{100 * EQUAL_WITHIN:.0f}% in this single run; repeated points tell a "
            "real difference from noise."
        )
    return " ".join(sentences)  # the memory it saved is the headline's, or the sentence before


def _listed(ratios: list[float]) -> str:
    """0.99x; 0.99x and 1.01x; 0.99x, 1.01x and 0.98x."""
    texts = [f"{r:.2f}x" for r in ratios]
    return texts[0] if len(texts) == 1 else f"{', '.join(texts[:-1])} and {texts[-1]}"


def per_cpu_second(point: Point) -> float | None:
    """Output tokens per CPU-second of the point's steps (None where CPU time was not measured)."""
    cpu, tokens = point.cpu_time_s, point.total_output_tokens
    return tokens / cpu if is_positive(cpu) and is_positive(tokens) and is_positive(point.duration) else None


def _memory_phrase(paged: Point, contiguous: Point) -> str:
    used, held = paged.kv_peak_allocated_bytes, contiguous.kv_peak_allocated_bytes
    if not is_positive(held) or used is None:
        return "KV memory not measured"
    reduction = 100 * (1 - used / held)
    return f"{human_bytes(used)} of KV memory at peak against {human_bytes(held)} ({reduction:.0f}% less)"


def _pairs(points: Sequence[Point]) -> tuple[list[Pair], list[Pair], list[Pair]]:
    """The (concurrency, paged, contiguous) pairs where paged ran its whole load: both holding the same batch,
    contiguous holding fewer requests at once, and contiguous out of KV memory."""
    by_key = points_by_key(points)
    equal: list[Pair] = []
    fewer: list[Pair] = []
    oom: list[Pair] = []
    for concurrency in sorted({p.concurrency for p in points}):
        paged, contiguous = by_key.get(("paged", concurrency)), by_key.get(("contiguous", concurrency))
        if not paged or not contiguous or paged.status != "ok":
            continue
        if contiguous.status == "oom":
            oom.append((concurrency, paged, contiguous))
        elif contiguous.status == "ok" and is_positive(contiguous.output_throughput):
            held_fewer = (contiguous.peak_running or 0) < (paged.peak_running or 0)
            (fewer if held_fewer else equal).append((concurrency, paged, contiguous))
    return equal, fewer, oom


def _fewer_sentence(concurrency: int, paged: Point, contiguous: Point) -> str:
    ratio = paged.output_throughput / contiguous.output_throughput
    return (
        f"At C={concurrency} the contiguous baseline held only {contiguous.peak_running} requests at once; "
        f"the rest waited for a slab, where paging held {paged.peak_running}. Paged ran at {ratio:.2f}x "
        f"contiguous's speed. Paging used {_memory_phrase(paged, contiguous)}."
    )


def _oom_sentence(concurrency: int, paged: Point, contiguous: Point, meta: RunMeta) -> str:
    reserve = meta.reserve
    why = (
        f"reserving max-len ({meta.max_len:,} tokens) per request"
        if reserve == "max" and meta.max_len
        else f"reserving by policy {reserve} per request"
        if reserve
        else "reserving a slab per request"
    )
    pool = contiguous.kv_pool_bytes or 0
    held, used = contiguous.kv_peak_allocated_bytes or 0, paged.kv_peak_allocated_bytes or 0
    share = f" ({100 * held / pool:.0f}% of the pool)" if pool else ""
    paged_share = f" ({100 * used / pool:.0f}% of the pool)" if pool else ""
    return (
        f"At C={concurrency} the contiguous baseline ran out of KV memory. {why[0].upper()}{why[1:]}, it held "
        f"{contiguous.peak_running} requests at once in {human_bytes(held)}{share} and rejected "
        f"{contiguous.rejected:,} of {contiguous.rejected + contiguous.completed:,}. "
        f"Paging held all {paged.peak_running} in {human_bytes(used)}{paged_share}. This is where paging wins."
    )


def _levels(values: list[int]) -> str:
    return ", ".join(f"C={c}" for c in values)


def _span(values: list[float], fmt) -> str:
    low, high = min(values), max(values)
    return fmt(low) if abs(high - low) < 0.5 else f"{fmt(low)} to {fmt(high)}"


def _reservation_words(meta: RunMeta) -> str:
    reserve, max_len = meta.reserve_policy, meta.max_len
    if reserve == "max":
        return f"max-len ({max_len:,} token slots) for every request" if max_len else "max-len for every request"
    if reserve == "pow2":
        return "the next power of two of each request's length"
    return "exactly each request's length (an oracle no real engine has)"


def sweep_verdict(rows: Sequence[ArticleRow], points: Sequence[Point], meta: RunMeta | None = None) -> SweepVerdict:
    """Where paging wins and why, in words, from the article's rows and the points: the headline, how the engines
    compare where both held the same batch, where the contiguous baseline held fewer or ran out of KV memory, the
    memory behind it and a reference engine's figures."""
    run = meta or RunMeta()  # none: the defaults a run's readers assume
    by_key = points_by_key(points)
    compared = [r for r in rows if r.gain_pct is not None]
    contiguous_oom = [r.concurrency for r in rows if r.status("contiguous") == "oom" and r.status("paged") == "ok"]
    paged_oom = [r.concurrency for r in rows if r.status("paged") == "oom" and r.status("contiguous") == "ok"]
    reductions = [r.kv_memory_reduction_pct for r in compared if r.kv_memory_reduction_pct is not None]
    sentences: list[str] = []

    if not compared and not contiguous_oom and not paged_oom:
        engines = sorted({p.engine for p in points})
        ok = [p for p in points if p.status == "ok"]
        headline = (
            f"A sweep of {', '.join(engines) or 'no engine'}: no paged/contiguous pair to compare"
            if points
            else "The sweep recorded no point"
        )
        for p in ok:
            sentences.append(f"{p.engine} at C={p.concurrency}: {tok_s(p.output_throughput, missing='-')}.")
        return SweepVerdict(headline, "neutral", sentences)

    if contiguous_oom:
        top = contiguous_oom[0]
        top_paged = by_key.get(("paged", top))
        served = top_paged.completed if top_paged else 0
        headline = (
            f"Paging held the load the contiguous baseline could not: at {_levels(contiguous_oom)} "
            f"contiguous ran out of KV memory, paged served {'all ' if top_paged and not top_paged.rejected else ''}"
            f"{served:,} request{'s' if served != 1 else ''}"
        )
        tone = "good"
    elif paged_oom:
        headline = (
            f"The paged engine ran out of KV memory at {_levels(paged_oom)} where the contiguous baseline did not"
        )
        tone = "bad"
    elif reductions and max(reductions) > 0:
        headline = (
            f"Paging served the same requests with {_span(reductions, lambda v: pct(v, 0))} less KV memory at peak"
        )
        tone = "good"
    else:
        headline = "Paging and the contiguous baseline held the same KV memory at peak"
        tone = "neutral"
    if paged_oom and tone != "bad":
        tone = "warn"

    if reductions and (contiguous_oom or paged_oom):  # else the headline said it
        sentences.append(
            f"KV memory at peak: paged needed {_span(reductions, lambda v: pct(v, 0))} less than "
            f"contiguous where both completed ({_levels([r.concurrency for r in compared])})."
        )
    equal, fewer, oom = _pairs(points)
    if equal:
        sentences.append(_equal_batch_finding(equal, run.simulated, run.threads or 1))
    sentences += [_fewer_sentence(*pair) for pair in fewer]
    sentences += [_oom_sentence(*pair, run) for pair in oom]
    why = _why(rows, by_key, run, contiguous_oom)
    if why:
        sentences.append(why)
    for engine in references(rows):
        cells = [f"{_reference_figure(r, engine)} at C={r.concurrency}" for r in rows if r.status(engine)]
        sentences.append(f"{REFERENCE_ENGINES[engine]} (reference): {', '.join(cells)}. {REFERENCE_CAPTION}.")
    return SweepVerdict(headline, tone, sentences)


def _why(
    rows: Sequence[ArticleRow], by_key: dict[tuple[str, int], Point], meta: RunMeta, contiguous_oom: list[int]
) -> str:
    """The memory behind the result, at the concurrency that shows it best (the first OOM, else the highest)."""
    candidates = contiguous_oom or [r.concurrency for r in rows if r.gain_pct is not None]
    if not candidates:
        return ""
    c = candidates[0] if contiguous_oom else candidates[-1]
    cont, paged = by_key.get(("contiguous", c)), by_key.get(("paged", c))
    if not cont or not paged or not cont.waste or not paged.waste:
        return ""
    cw, pw = cont.shares, paged.shares
    held_c = (cw.reservation_pct or 0) + (cw.internal_pct or 0)
    held_p = (pw.reservation_pct or 0) + (pw.internal_pct or 0)
    block = meta.block_size
    text = (
        f"Why: the contiguous baseline reserves {_reservation_words(meta)} when it admits it. At C={c}, "
        f"reservation and internal fragmentation held {held_c:.1f}% of its KV pool on average (token states "
        f"{cw.token_state_pct or 0:.1f}%). Paged held {held_p:.1f}% that way, allocating blocks "
        f"{f'of {block} tokens ' if block else ''}as they fill (token states {pw.token_state_pct or 0:.1f}%)."
    )
    if (paged.peak_running or 0) > (cont.peak_running or 0):
        text += (
            f" The memory paging leaves free lets more requests run at once: at most "
            f"{paged.peak_running} against {cont.peak_running}."
        )
    return text


def _reference_figure(row: ArticleRow, engine: str) -> str:
    """A reference engine's throughput at a point, or its status where it has none."""
    figures = row.figures(engine)
    return tok_s(figures.tps, missing="-") if figures and figures.ok else str(row.status(engine))


def references(rows: Sequence[ArticleRow]) -> list[str]:
    """The reference engines (vLLM) that ran at some concurrency of the sweep."""
    return [engine for engine in REFERENCE_ENGINES if any(row.status(engine) for row in rows)]
