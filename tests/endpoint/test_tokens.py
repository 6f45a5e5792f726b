"""Token counts a server did not report: the tokenizer, else one per token event; each says where it came from."""

from __future__ import annotations

from kvbench.endpoint.record import RequestRecord
from kvbench.endpoint.tokens import fill_token_counts


class Tokenizer:
    chat_template = "yes"

    def __call__(self, texts, add_special_tokens=True):
        return {"input_ids": [([1] if add_special_tokens else []) + [7] * len(t.split()) for t in texts]}

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize and add_generation_prompt
        return [1] + [7] * sum(len(m["content"].split()) + 2 for m in messages) + [2]


def record(text: str, events: int, prompt_input=None, ok=True) -> RequestRecord:
    r = RequestRecord(0, 0, ok=ok, text=text, token_times=[0.1 * i for i in range(1, events + 1)])
    r.prompt_input = prompt_input
    return r


def test_with_a_tokenizer():
    records = [
        record(" a b c", 2, "x y"),
        record(" d", 1, [{"role": "user", "content": "p q"}]),
        record("", 0, "z", ok=False),
    ]
    fill_token_counts(records, Tokenizer())
    assert [(r.output_tokens, r.output_tokens_from) for r in records[:2]] == [(3, "tokenizer"), (1, "tokenizer")]
    assert (records[0].prompt_tokens, records[0].prompt_tokens_from) == (3, "tokenizer")  # with its BOS
    assert records[1].prompt_tokens == 1 + 4 + 1  # through the chat template
    assert records[2].output_tokens is None and records[0].prompt_input is None


def test_without_a_tokenizer_one_token_per_event_and_prompts_stay_unknown():
    records = [record(" a b c", 2, "x y")]
    fill_token_counts(records, None)
    assert (records[0].output_tokens, records[0].output_tokens_from) == (2, "events")
    assert records[0].prompt_tokens is None


def test_usage_is_never_overwritten():
    r = record(" a b c", 3)
    r.output_tokens, r.output_tokens_from, r.prompt_tokens, r.prompt_tokens_from = 9, "usage", 4, "usage"
    fill_token_counts([r], Tokenizer())
    assert (r.output_tokens, r.prompt_tokens) == (9, 4)
