"""Conversation lists for an endpoint, from what the sweep already builds and from two workloads of their own.

- :func:`from_engine_requests`: the sweep's request list (a scenario's drawn lengths with seeded random prompt
  ids, a requests file, a dataset tokenized with the model's tokenizer): the same token ids, ``max_tokens``
  and EOS rule, sent to ``/v1/completions``, so a server runs exactly what kvbench's engines run.
- :func:`from_dataset`: a dataset sample's prompts as written (for ``/v1/chat/completions``, where the server
  applies its own chat template).
- :func:`shared_prefix`: G groups whose prompts open with the same L tokens (a system prompt, a document),
  each followed by its own suffix, in a seeded order: the workload where a prefix cache pays.
- :func:`multi_turn`: conversations of T turns that resend their history, so each turn's prompt is the last
  one's prompt and answer plus a new user turn; groups of them may share a system prompt.
- :func:`as_text`: token-id prompts decoded to text with the model's tokenizer (for the chat API).
- :func:`from_prefix_trace`: a hash-id trace's synthesised prompts at its arrival times, sessions in order.
- :func:`shaped_to_hit_rate`: the sweep's token-id prompts reshaped so that a share of their tokens opens with
  one shared sequence stored beforehand (a prewarm): a workload with a chosen prefix-cache hit rate.

Synthetic text without a tokenizer is drawn from a list of common one-token English words, so lengths are
close to, not exactly, the asked token counts; the server's ``usage`` gives the real ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvbench.endpoint.conversation import Conversation, Turn
from kvbench.engine.request import Request
from kvbench.errors import KvbenchError
from kvbench.workload.dataset import DatasetSample
from kvbench.workload.prefix_trace import PrefixTrace, prompt_token_ids

WORDS = (
    "the of and to in is it that for on with as was at by be this have from or one had not but what all "
    "were when we there can an your which their said if do will each about how up out them then she many some "
    "so these would other into has more her two like him see time could no make than first been its who now "
    "people my made over did down only way find use may water long little very after words called just where "
    "most know get through back much go good new write our me man too any day same right look think also "
    "around another came come work three word must because does part even place well such here take why help "
    "put different away again off went old number great tell men say small every found still between name "
    "should home big give air line set own under read last never us left end along while might next sound "
    "below saw something thought both few those always show large often together asked house world going want "
    "school important until form food keep children feet land side without boy once animal life enough took "
    "four head above kind began almost live page got earth need far hand high year mother light country father "
    "let night picture being study second soon story since white ever paper hard near sentence better best "
    "across during today however sure knew try told young sun thing whole hear example heard several change "
    "answer room sea against top turned learn point city play toward five himself usually money seen didn car "
    "morning given body family later turn move face door cut done group true leave color red friend pretty "
    "eat"
).split()


def from_engine_requests(requests: Sequence[Request]) -> list[Conversation]:
    """One single-turn conversation per engine request: its prompt ids, ``max_tokens`` and EOS rule."""
    out = []
    for request in requests:
        if request.prompt_token_ids is None:
            raise KvbenchError("a request without prompt token ids cannot be sent to a server")
        ignore_eos = bool(getattr(request.sampling, "ignore_eos", False))
        out.append(
            Conversation(
                request.request_id,
                (Turn(tuple(request.prompt_token_ids), request.max_tokens, len(request.prompt_token_ids), ignore_eos),),
            )
        )
    return out


def from_dataset(sample: DatasetSample, max_len: int, stop: str) -> list[Conversation]:
    """A dataset sample's prompts as written, each run to its reference length (``length``) or until the model
    stops, within ``max_len`` (``eos``). ``prompt_len`` is the count the sample made (through the chat
    template when the tokenizer has one: what a chat server reads)."""
    out = []
    for index, request in enumerate(sample.requests):
        if request.prompt is None:
            raise KvbenchError("this dataset sample has no prompt texts")
        if stop == "length":
            if request.output_len is None:
                raise KvbenchError(f"dataset request {index} has no reference answer length")
            turn = Turn(request.prompt, request.output_len, request.prompt_len, ignore_eos=True)
        else:
            turn = Turn(request.prompt, max(1, max_len - request.prompt_len), request.prompt_len)
        out.append(Conversation(index, (turn,)))
    return out


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KvbenchError(f"{name.replace('_', ' ')} must be a positive integer, got {value!r}")


def shared_prefix(
    groups: int,
    per_group: int,
    prefix_len: int,
    suffix_len: int,
    output_len: int,
    vocab_size: int,
    seed: int,
    ignore_eos: bool = True,
    first_id: int = 0,
) -> list[Conversation]:
    """``groups`` x ``per_group`` token-id prompts: a group's ``prefix_len`` random ids, then ``suffix_len`` of
    the request's own, shuffled with ``seed`` so a group's requests are spread over the point. Ids are drawn
    from ``first_id`` up to ``vocab_size`` (keep special tokens out)."""
    _check_positive(
        groups=groups,
        requests_per_group=per_group,
        prefix_length=prefix_len,
        suffix_length=suffix_len,
        output_length=output_len,
    )
    if vocab_size <= first_id:
        raise KvbenchError(f"vocabulary size {vocab_size} leaves no token id from {first_id}")
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(first_id, vocab_size, prefix_len).tolist() for _ in range(groups)]
    order = rng.permutation(groups * per_group)
    out = []
    for index, slot in enumerate(order):
        group = int(slot) // per_group
        prompt = prefixes[group] + rng.integers(first_id, vocab_size, suffix_len).tolist()
        out.append(Conversation(index, (Turn(tuple(prompt), output_len, len(prompt), ignore_eos),), group=group))
    return out


def random_text(rng: np.random.Generator, tokens: int, tokenizer: Any | None = None) -> str:
    """About ``tokens`` tokens of seeded text: decoded random ids of the tokenizer's ordinary vocabulary, or
    common one-token words without one."""
    if tokenizer is None:
        return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), tokens))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    size = len(tokenizer)
    ids = [int(i) for i in rng.integers(0, size, tokens * 2) if int(i) not in special][:tokens]
    return tokenizer.decode(ids, skip_special_tokens=True)


def multi_turn(
    conversations: int,
    turns: int,
    user_len: int,
    output_len: int,
    seed: int,
    tokenizer: Any | None = None,
    groups: int = 0,
    system_len: int = 0,
    ignore_eos: bool = True,
) -> list[Conversation]:
    """``conversations`` conversations of ``turns`` turns, each user turn about ``user_len`` tokens of seeded
    text and each answer ``output_len`` tokens; with ``groups`` > 0 and ``system_len`` > 0, conversation i
    opens with the system prompt of group i mod ``groups``."""
    _check_positive(conversations=conversations, turns=turns, user_length=user_len, output_length=output_len)
    if (groups > 0) != (system_len > 0):
        raise KvbenchError("a shared system prompt needs both a number of groups and a length")
    rng = np.random.default_rng(seed)
    systems = [random_text(rng, system_len, tokenizer) for _ in range(groups)]
    out = []
    for index in range(conversations):
        user_turns = tuple(
            Turn(random_text(rng, user_len, tokenizer), output_len, ignore_eos=ignore_eos) for _ in range(turns)
        )
        group = index % groups if groups else None
        out.append(Conversation(index, user_turns, systems[group] if group is not None else None, group))
    return out


def as_text(conversations: Sequence[Conversation], tokenizer: Any) -> list[Conversation]:
    """Token-id prompts decoded to text with ``tokenizer`` (special tokens kept, so a templated prompt stays
    one); text prompts unchanged. The token counts become the server's to report."""
    out = []
    for conversation in conversations:
        if not conversation.token_ids:
            out.append(conversation)
            continue
        turns = tuple(
            replace(turn, prompt=tokenizer.decode(list(turn.prompt)), prompt_len=None) for turn in conversation.turns
        )
        out.append(replace(conversation, turns=turns))
    return out


@dataclass(frozen=True)
class HitRateTarget:
    """A workload reshaped to a prefix-cache hit rate (``sweep --prefix-hit-rate``)."""

    rate: float  # the share of prompt tokens a server's prefix cache should serve, 0..1
    vocab_size: int  # prompt ids are drawn below it
    seed: int = 0
    first_id: int = 0  # and from it (keep special tokens out)


def shaped_to_hit_rate(
    conversations: Sequence[Conversation], target: HitRateTarget, block_size: int
) -> tuple[list[Conversation], list[Conversation], float]:
    """The same prompt lengths and outputs, each prompt opening with the first k blocks of one shared sequence
    (k = its length times the rate, in whole blocks of ``block_size``, never the block of its last token) and
    the rest its own; the prewarm that stores that sequence's blocks once before the load; and the rate
    planned (the tokens served if every prefix block stays cached, over the prompt tokens)."""
    if not 0.0 <= target.rate <= 1.0:
        raise KvbenchError(f"a target hit rate is a share from 0 to 1, got {target.rate!r}")
    prompts = [c.turns[0] for c in conversations]
    if any(len(c.turns) != 1 for c in conversations) or any(isinstance(t.prompt, str) for t in prompts):
        raise KvbenchError("a target hit rate shapes token-id prompts of one turn each (the completions API)")
    rng = np.random.default_rng(target.seed + 7919)
    blocks = [min(round(target.rate * len(t.prompt) / block_size), (len(t.prompt) - 1) // block_size) for t in prompts]
    shared = rng.integers(target.first_id, target.vocab_size, max(blocks, default=0) * block_size + 1).tolist()
    out = []
    for conversation, turn, k in zip(conversations, prompts, blocks, strict=True):
        head = shared[: k * block_size]
        own = rng.integers(target.first_id, target.vocab_size, len(turn.prompt) - len(head)).tolist()
        if own[0] == shared[len(head)]:  # the shared sequence must end here, not run on by chance
            own[0] = target.first_id + (own[0] - target.first_id + 1) % (target.vocab_size - target.first_id)
        prompt = tuple(head + own)
        out.append(replace(conversation, turns=(replace(turn, prompt=prompt, prompt_len=len(prompt)),)))
    prewarm = []
    if max(blocks, default=0):
        prompt = tuple(shared[: max(blocks) * block_size + 1])  # every shared block full, the last token apart
        # two output tokens: a one-token answer from a server without a tokenizer can stream no token text at all
        prewarm.append(Conversation(0, (Turn(prompt, 2, len(prompt), True),)))
    total = sum(len(t.prompt) for t in prompts)
    return out, prewarm, (sum(blocks) * block_size / total if total else 0.0)


def from_prefix_trace(trace: PrefixTrace, vocab_size: int) -> list[Conversation]:
    """A hash-id trace as conversations: each request's synthesised token ids (the same as kvbench's own
    simulation of the trace runs) sent at its arrival time, the requests of one session as the turns of one
    conversation, in order; ``max_tokens`` its output length (EOS ignored)."""
    sessions: dict[str, list[Turn]] = {}
    order: list[list[Turn]] = []
    for request in trace.requests:
        prompt = prompt_token_ids(request, trace.block_size, vocab_size)
        turn = Turn(tuple(prompt), max(1, request.output_len), len(prompt), True, request.arrival_s)
        if request.session is None:
            order.append([turn])
        elif request.session in sessions:
            sessions[request.session].append(turn)
        else:
            sessions[request.session] = [turn]
            order.append(sessions[request.session])
    return [Conversation(index, tuple(turns)) for index, turns in enumerate(order)]
