"""A point's prefix-cache reuse as its requests report it, beside the server's own counters.

Each answer's ``usage.prompt_tokens_details.cached_tokens`` says how many of its prompt tokens the server's
prefix cache served (vLLM with ``--enable-prompt-tokens-details``, SGLang, kvbench serve). A server that does
not say leaves the request's figure unknown, never 0. Over the point: the hit rate from the requests (cached
over prompt tokens of the requests that said), per conversation turn and per conversation, and the same rate
from the server's counters (the difference of ``prefix_cache_hits`` over ``prefix_cache_queries`` across the
load). The two count the same tokens when this client is the server's only one; a gap larger than one block per
request is flagged with its likely reason.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvbench.endpoint.conversation import Conversation
from kvbench.endpoint.record import RequestRecord
from kvbench.results.endpoint_figures import ServerMetrics
from kvbench.results.prefix_reuse_figures import PrefixReuse, ReuseSpread, ReuseTarget, WorkloadReuse


def prefix_reuse(
    records: Sequence[RequestRecord], server: ServerMetrics | None, target: ReuseTarget | None = None
) -> PrefixReuse:
    """The point's reuse figures (see the module docstring); rates are shares in [0, 1]. With a ``target`` hit
    rate (its rate, planned rate and block size): the achieved rate judged against it."""
    done = [r for r in records if r.ok]
    known = [r for r in done if r.cached_tokens is not None and r.prompt_tokens]
    cached = sum(r.cached_tokens or 0 for r in known)
    prompt = sum(r.prompt_tokens or 0 for r in known)
    rate = cached / prompt if known and prompt else None
    server = server or ServerMetrics()
    hits, queries = server.prefix_cache_hits, server.prefix_cache_queries
    counters_rate = server.prefix_cache_hit_rate
    difference_tokens = None
    flag = None
    if known and len(known) < len(done):
        flag = f"{len(done) - len(known)} of {len(done)} answers did not report their cached tokens"
    if known and len(known) == len(done) and isinstance(hits, (int, float)):
        difference_tokens = cached - hits
        block = server.block_size
        if not block:
            flag = "the server's block size is unknown: the requests' and the counters' hits are not judged"
        elif abs(difference_tokens) > block * len(done):
            flag = _why_apart(difference_tokens, hits, queries, prompt, block, len(done), server.preemptions)
    return PrefixReuse(
        requests=len(done),
        requests_reporting=len(known),
        cached_tokens=cached if known else None,
        prompt_tokens=prompt if known else None,
        hit_rate_requests=rate,
        hit_rate_by_turn=_by_turn(known),
        hit_rate_by_conversation=_spread(_rates_by(known, lambda r: r.conversation)),
        hit_rate_counters=counters_rate,
        counter_hits=hits,
        difference_tokens=difference_tokens,
        difference_pct_points=None if rate is None or counters_rate is None else (rate - counters_rate) * 100.0,
        flag=flag,
        target=_judged(target, rate, counters_rate, prompt, len(known)) if target is not None else None,
    )


def _judged(
    target: ReuseTarget, requests_rate: float | None, counters_rate: float | None, prompt: int, count: int
) -> ReuseTarget:
    """The achieved rate against the target, within max(0.5 points, one block over the mean prompt)."""
    achieved = requests_rate if requests_rate is not None else counters_rate
    block = target.block_size or 0
    tolerance = max(0.005, block / (prompt / count)) if count and prompt else 0.005
    met = abs(achieved - target.rate) <= tolerance if achieved is not None else None
    return replace(target, achieved=achieved, tolerance=tolerance, met=met)


def _why_apart(
    difference: float, hits: float, queries: Any, prompt: int, block: int, requests: int, preemptions: Any = None
) -> str:
    side = "more" if difference < 0 else "fewer"
    reason = (
        "another client shared the server during the point, or it counts hits it did not report per request"
        if difference < 0
        else "the counter counts queries differently (e.g. only the first admission, or a preempted request again)"
    )
    if isinstance(queries, (int, float)) and queries > prompt + block * requests:
        reason = "the server looked up more prompt tokens than these requests sent: another client shared the server"
    if difference < 0 and isinstance(preemptions, (int, float)) and preemptions > 0:
        # a preempted request's prompt is looked up (and hit) again when it is admitted again; its answer counts once
        reason = (
            f"the server preempted {preemptions:,.0f} times during the point, and counts the prompt of a preempted "
            "request again when it is admitted again (its answer reports the first admission), or another client "
            "shared the server"
        )
    return (
        f"the server's counters count {abs(difference):,.0f} {side} cached tokens than the answers report "
        f"(more than one block of {block} per request over {requests} requests): {reason}"
    )


def _rates_by(records: Sequence[RequestRecord], key: Any) -> dict[int, float]:
    cached: dict[int, int] = defaultdict(int)
    prompt: dict[int, int] = defaultdict(int)
    for record in records:
        cached[key(record)] += record.cached_tokens or 0
        prompt[key(record)] += record.prompt_tokens or 0
    return {k: cached[k] / prompt[k] for k in sorted(prompt) if prompt[k]}


def _by_turn(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Turn (from 0) -> hit rate; keys are text, as JSON keeps them."""
    return {str(turn): rate for turn, rate in _rates_by(records, lambda r: r.turn).items()}


def _spread(rates: dict[int, float]) -> ReuseSpread | None:
    if not rates:
        return None
    values = sorted(rates.values())
    return ReuseSpread(len(values), values[0], statistics.median(values), values[-1])


def workload_reuse(
    conversations: Sequence[Conversation], block_size: int | None, before: Sequence[Conversation] = ()
) -> WorkloadReuse | None:
    """What the workload itself allows, in the order it is sent: the prompt tokens an unbounded prefix cache of
    ``block_size``-token blocks would serve (each request's leading full blocks that an earlier prompt holds,
    never the block of its last token), and how many requests start with the same half block as an earlier one
    yet find no full block of it (a shared prefix shorter than one block: never served). None for text prompts
    (their tokens are the server's) or an unknown block size. ``before``: prompts sent earlier (a prewarm), whose
    blocks the cache holds but whose tokens are not counted."""
    if not block_size:
        return None
    turns = [t for c in conversations for t in c.turns]
    if not turns or any(isinstance(t.prompt, str) for t in turns):
        return None
    if any(len(c.turns) > 1 for c in conversations):  # a trace's sessions: every turn a whole prompt, by time
        if any(t.at_s is None for t in turns):
            return None
        turns.sort(key=lambda t: t.at_s or 0.0)
    prompts = [t.prompt for t in turns]
    earlier = [t.prompt for c in before for t in c.turns if not isinstance(t.prompt, str)]
    seen_blocks: set[int] = set()
    half = max(1, block_size // 2)  # a shared head this long is a real shared prefix (not a lone BOS token)
    heads: set[int] = set()  # the first ``half`` tokens of every earlier prompt, hashed
    ideal = total = under_one_block = 0
    for index, prompt in enumerate([*earlier, *prompts]):
        counted = index >= len(earlier)
        tokens = tuple(prompt)
        total += len(tokens) if counted else 0
        usable = (len(tokens) - 1) // block_size
        parent, hit, chain = 0, 0, []
        for index in range(len(tokens) // block_size):
            parent = hash((parent, tokens[index * block_size : (index + 1) * block_size]))
            chain.append(parent)
            if index < usable and hit == index and parent in seen_blocks:
                hit += 1
        ideal += hit * block_size if counted else 0
        head = hash(tokens[:half]) if len(tokens) >= half else None
        if counted and hit == 0 and head is not None and head in heads:
            under_one_block += 1
        if head is not None:
            heads.add(head)
        seen_blocks.update(chain)
    return WorkloadReuse(block_size, ideal, ideal / total if total else None, under_one_block)
