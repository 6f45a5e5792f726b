"""A hash-id trace replayed over HTTP at its arrival times: each request's synthesised token ids to
``/v1/completions``, with the prompt tokens the server says it served from its prefix cache.

The prompts are :func:`~kvbench.workload.prefix_trace.prompt_token_ids` of the trace, the same tokens for
every server and for kvbench's own simulation, so a server's hit rate and the simulated one are comparable.
Open loop: a request is sent at its arrival time whatever the earlier ones are doing; each has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from kvbench import json_input
from kvbench.endpoint.openai import usage_counts as openai_usage_counts
from kvbench.measure.http_fetch import FetchError, fetch, open_session
from kvbench.workload.prefix_trace import PrefixTrace, prompt_token_ids

MAX_ANSWER_BYTES = 1 << 20  # a non-streamed completion of a few tokens is a few hundred bytes


@dataclass(frozen=True)
class Replayed:
    index: int
    sent_s: float  # from the start of the replay
    latency_s: float | None  # None: it failed
    prompt_tokens: int | None  # as the server counted them
    cached_tokens: int | None  # None: the server did not say (never taken as 0)
    error: str | None = None


def usage_counts(body: bytes) -> tuple[int | None, int | None]:
    """(prompt tokens, cached prompt tokens) from a completion's ``usage``: vLLM's and SGLang's
    ``prompt_tokens_details.cached_tokens``; None for what the answer does not hold."""
    try:
        data = json_input.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, None
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None, None
    prompt, _, cached = openai_usage_counts(usage)
    return prompt, cached


def replay_trace(
    base_url: str,
    trace: PrefixTrace,
    vocab_size: int,
    model: str,
    max_tokens: int | None = None,
    timeout_s: float = 120.0,
) -> list[Replayed]:
    """Send every request of ``trace`` at its arrival time and wait for all; ``max_tokens`` caps each output."""
    return asyncio.run(_replay(base_url.rstrip("/"), trace, vocab_size, model, max_tokens, timeout_s))


async def _replay(
    base: str, trace: PrefixTrace, vocab: int, model: str, cap: int | None, timeout_s: float
) -> list[Replayed]:
    bodies = []
    for request in trace.requests:
        tokens = max(1, request.output_len if cap is None else min(request.output_len, cap))
        prompt = prompt_token_ids(request, trace.block_size, vocab)
        body = {"model": model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "temperature": 0.0}
        bodies.append(body)
    async with open_session(connections=256) as session:
        start = time.perf_counter()

        async def one(index: int) -> Replayed:
            wait = trace.requests[index].arrival_s - (time.perf_counter() - start)
            if wait > 0:
                await asyncio.sleep(wait)
            sent = time.perf_counter()
            try:
                answer = await fetch(
                    f"{base}/v1/completions",
                    method="POST",
                    json=bodies[index],
                    timeout_s=timeout_s,
                    max_bytes=MAX_ANSWER_BYTES,
                    session=session,
                )
            except FetchError as err:
                return Replayed(index, sent - start, None, None, None, str(err))
            if not answer.ok:
                return Replayed(index, sent - start, None, None, None, f"HTTP {answer.status}")
            prompt, cached = usage_counts(answer.body)
            return Replayed(index, sent - start, time.perf_counter() - sent, prompt, cached)

        return list(await asyncio.gather(*(one(i) for i in range(len(bodies)))))
