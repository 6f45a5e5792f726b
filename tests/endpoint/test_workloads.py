"""What is sent: conversations and their history, and the workloads built for endpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.endpoint.conversation import Conversation, Turn, request_count
from kvbench.endpoint.workloads import (
    WORDS,
    as_text,
    from_dataset,
    from_engine_requests,
    multi_turn,
    shared_prefix,
)
from kvbench.engine.request import make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.workload.dataset import TokenCounter, sample_dataset


def test_history_is_resent_for_both_apis():
    conversation = Conversation(0, (Turn("Hi.", 4), Turn("And then?", 4), Turn("Thanks.", 2)), system="Be brief.")
    assert conversation.completion_prompt(0, []) == "Be brief.Hi."
    assert (
        conversation.completion_prompt(2, [" Hello!", " Then this."])
        == "Be brief.Hi. Hello!\nAnd then? Then this.\nThanks."
    )
    assert conversation.chat_messages(1, [" Hello!"]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": " Hello!"},
        {"role": "user", "content": "And then?"},
    ]
    assert request_count([conversation, Conversation(1, (Turn("x", 1),))]) == 4


def test_turns_and_conversations_refuse_what_cannot_be_sent():
    with pytest.raises(ValueError, match="max_tokens"):
        Turn("x", 0)
    with pytest.raises(ValueError, match="empty"):
        Turn("", 3)
    with pytest.raises(ValueError, match="needs text prompts"):
        Conversation(0, (Turn((1, 2), 3), Turn((3,), 3)))
    with pytest.raises(ValueError, match="chat request needs text"):
        Conversation(0, (Turn((1, 2), 3),)).chat_messages(0, [])
    assert Turn([5, 6, 7], 2).prompt_len == 3


def test_the_sweeps_request_list_is_sent_as_it_is():
    requests = [
        make_request(0, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True)),
        make_request(1, [4, 5], SamplingParams(max_tokens=7)),
    ]
    conversations = from_engine_requests(requests)
    assert [c.turns[0] for c in conversations] == [Turn((1, 2, 3), 5, 3, True), Turn((4, 5), 7, 2, False)]
    assert conversations[0].completion_prompt(0, []) == [1, 2, 3]


def test_shared_prefix_groups():
    conversations = shared_prefix(
        groups=3, per_group=4, prefix_len=10, suffix_len=5, output_len=6, vocab_size=100, seed=7, first_id=3
    )
    assert conversations == shared_prefix(3, 4, 10, 5, 6, 100, 7, first_id=3)  # seeded
    assert len(conversations) == 12 and sorted(c.index for c in conversations) == list(range(12))
    by_group: dict[int, list] = {}
    for c in conversations:
        by_group.setdefault(c.group, []).append(c.turns[0].prompt)
        assert len(c.turns[0].prompt) == 15 and c.turns[0].max_tokens == 6 and c.turns[0].ignore_eos
        assert min(c.turns[0].prompt) >= 3
    assert sorted(by_group) == [0, 1, 2] and all(len(p) == 4 for p in by_group.values())
    prefixes = {g: {p[:10] for p in prompts} for g, prompts in by_group.items()}
    assert all(len(p) == 1 for p in prefixes.values()) and len({next(iter(p)) for p in prefixes.values()}) == 3
    assert [c.group for c in conversations] != sorted(c.group for c in conversations)  # spread, not in blocks
    with pytest.raises(KvbenchError, match="prefix length must be a positive integer"):
        shared_prefix(1, 1, 0, 1, 1, 10, 0)


def test_multi_turn_conversations_without_a_tokenizer():
    conversations = multi_turn(conversations=4, turns=3, user_len=6, output_len=5, seed=1, groups=2, system_len=3)
    assert len(conversations) == 4 and all(len(c.turns) == 3 for c in conversations)
    assert conversations[0].system == conversations[2].system != conversations[1].system
    words = conversations[0].turns[0].prompt.split()
    assert len(words) == 6 and set(words) <= set(WORDS)
    assert conversations[0].turns[0].prompt_len is None  # the server counts it
    with pytest.raises(KvbenchError, match="both a number of groups and a length"):
        multi_turn(2, 2, 3, 3, 0, groups=2)


class WordTokenizer:
    """A stand-in tokenizer: one token per word; ids index a small vocabulary."""

    vocab = ["<s>", "</s>"] + [f"t{i}" for i in range(50)]
    all_special_ids = [0, 1]
    chat_template = None

    def __len__(self):
        return len(self.vocab)

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(self.vocab[i] for i in ids if not (skip_special_tokens and i in self.all_special_ids))

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [([0] if add_special_tokens else []) + [2] * len(t.split()) for t in texts]}


def test_multi_turn_text_from_a_tokenizer_and_token_ids_decoded_for_chat():
    conversations = multi_turn(2, 2, user_len=8, output_len=3, seed=0, tokenizer=WordTokenizer())
    prompt = conversations[0].turns[0].prompt
    assert len(prompt.split()) == 8 and "<s>" not in prompt
    decoded = as_text(from_engine_requests([make_request(0, [0, 2, 3], SamplingParams(max_tokens=2))]), WordTokenizer())
    assert decoded[0].turns[0].prompt == "<s> t0 t1" and decoded[0].turns[0].prompt_len is None


def test_a_dataset_sample_keeps_its_prompt_texts(tmp_path: Path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "one two three four five", "output_len": 6}\n'
        '{"prompt": "six seven eight nine ten eleven", "output_len": 5}\n'
    )
    sample = sample_dataset(path, TokenCounter(None), max_len=64)
    conversations = from_dataset(sample, max_len=64, stop="length")
    assert [
        (c.turns[0].prompt, c.turns[0].max_tokens, c.turns[0].prompt_len, c.turns[0].ignore_eos) for c in conversations
    ] == [("one two three four five", 6, 5, True), ("six seven eight nine ten eleven", 5, 6, True)]
    eos = from_dataset(sample, max_len=64, stop="eos")
    assert [(c.turns[0].max_tokens, c.turns[0].ignore_eos) for c in eos] == [(59, False), (58, False)]


def test_prompts_shaped_to_a_hit_rate_keep_their_lengths_and_share_whole_blocks():
    from kvbench.endpoint.workloads import HitRateTarget, shaped_to_hit_rate

    lengths = [40, 100, 17, 250, 64]
    base = [Conversation(i, (Turn(tuple(range(1, n + 1)), 8),)) for i, n in enumerate(lengths)]
    for rate in (0.0, 0.5, 0.9, 1.0):
        shaped, prewarm, planned = shaped_to_hit_rate(base, HitRateTarget(rate, 500, seed=3, first_id=5), 16)
        assert [len(c.turns[0].prompt) for c in shaped] == lengths
        assert all(5 <= t < 500 for c in shaped for t in c.turns[0].prompt)
        # whole blocks of one shared sequence, never the block of the last token
        shared = [sum(1 for _ in _common_blocks(c.turns[0].prompt, prewarm, 16)) for c in shaped]
        assert all(k * 16 <= n - 1 for k, n in zip(shared, lengths, strict=True))
        assert planned == pytest.approx(sum(shared) * 16 / sum(lengths))
        assert abs(planned - rate) <= 16 / (sum(lengths) / len(lengths)) or rate == 1.0
        assert (prewarm == []) == (rate == 0.0)


def _common_blocks(prompt, prewarm, block):
    if not prewarm:
        return
    stored = prewarm[0].turns[0].prompt
    for k in range(len(prompt) // block):
        if prompt[: (k + 1) * block] != stored[: (k + 1) * block]:
            return
        yield k


def test_a_hit_rate_is_refused_outside_0_1_and_for_text_prompts():
    from kvbench.endpoint.workloads import HitRateTarget, shaped_to_hit_rate

    with pytest.raises(KvbenchError):
        shaped_to_hit_rate([Conversation(0, (Turn((1, 2, 3), 4),))], HitRateTarget(1.5, 100), 16)
    with pytest.raises(KvbenchError):
        shaped_to_hit_rate([Conversation(0, (Turn("hello", 4),))], HitRateTarget(0.5, 100), 16)
