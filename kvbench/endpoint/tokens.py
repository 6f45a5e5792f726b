"""Token counts a server did not report, filled in after a point (never while requests are timed).

The stream's ``usage`` is the truth. Where it is missing: output tokens are counted with the model's tokenizer
on the generated text, or, with no tokenizer, as one token per token event (what vLLM and SGLang send by
default, an estimate elsewhere); prompt tokens with the tokenizer (through its chat template for chat
messages), else they stay unknown. Each record says where its counts came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.endpoint.record import RequestRecord


def fill_token_counts(records: Sequence[RequestRecord], tokenizer: Any | None = None) -> None:
    """Count what the server left out, in place, for the completed records."""
    missing_out = [r for r in records if r.ok and r.output_tokens is None]
    if missing_out:
        if tokenizer is not None:
            counts = _encode_lengths(tokenizer, [r.text for r in missing_out], special=False)
            for record, count in zip(missing_out, counts, strict=True):
                record.output_tokens, record.output_tokens_from = count, "tokenizer"
        else:
            for record in missing_out:
                record.output_tokens, record.output_tokens_from = len(record.token_times), "events"
    if tokenizer is None:
        return
    missing_in = [r for r in records if r.ok and r.prompt_tokens is None and r.prompt_input is not None]
    texts = [r for r in missing_in if isinstance(r.prompt_input, str)]
    for record, count in zip(
        texts, _encode_lengths(tokenizer, [r.prompt_input for r in texts], special=True), strict=True
    ):
        record.prompt_tokens, record.prompt_tokens_from = count, "tokenizer"
    for record in missing_in:
        if isinstance(record.prompt_input, list):
            record.prompt_tokens, record.prompt_tokens_from = _chat_length(tokenizer, record.prompt_input), "tokenizer"
    for record in missing_in:
        record.prompt_input = None


def _encode_lengths(tokenizer: Any, texts: list[str], special: bool) -> list[int]:
    if not texts:
        return []
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=special)["input_ids"]]


def _chat_length(tokenizer: Any, messages: list[dict[str, str]]) -> int | None:
    if getattr(tokenizer, "chat_template", None):
        try:
            ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - a template that cannot render leaves the count unknown
            return None
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return len(ids)
    return None  # the server's own template is unknown: no honest count
