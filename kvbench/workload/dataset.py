"""Datasets of real prompts: ShareGPT JSON (what vLLM's and SGLang's benchmarks read) and JSONL of prompts.

Two formats, told apart by the first character of the file:

- ShareGPT: a JSON list of ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}``
  (``messages`` with ``role``/``content`` is read too). The first human turn is the prompt, the assistant turn
  after it the reference answer.
- JSON lines of ``{"prompt": "...", "output_len": N}``; ``output_len`` is optional.

Prompts are tokenized with the model's tokenizer (through its chat template when it has one); without a
tokenizer (the random-weight presets) lengths are counted as words and punctuation marks, a stand-in for a
BPE tokenizer's count. Then, as vLLM's benchmark does, records too short or too long for the run are dropped,
and N requests are drawn with a seed. Records that cannot be read are counted and skipped; a file that is
not JSON, or nothing left to run, is a one-line error.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from kvbench import json_input
from kvbench.errors import KvbenchError
from kvbench.workload.jsonl import read_text

MIN_TOKENS = 4  # vLLM's ShareGPT sampling drops prompts and answers shorter than this
HUMAN_ROLES = ("human", "user")
ASSISTANT_ROLES = ("gpt", "assistant", "chatgpt", "bard", "model")
WORD_PATTERN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class DatasetRecord:
    prompt: str
    answer: str | None = None  # the reference answer (ShareGPT), if any
    output_len: int | None = None  # an explicit answer length in tokens (JSONL)


@dataclass
class DatasetFile:
    path: Path
    format: str  # "sharegpt" | "jsonl"
    records: list[DatasetRecord]
    total: int  # records in the file, readable or not
    skipped: Counter = field(default_factory=Counter)  # reason -> records that could not be read


def shipped_files(folder_name: str, suffixes: tuple[str, ...]) -> dict[str, Path]:
    """Files shipped with kvbench in ``scenarios/<folder_name>`` ending in ``suffixes``, by name."""
    folder = resources.files("kvbench.scenarios").joinpath(folder_name)
    if not folder.is_dir():
        return {}
    return {Path(entry.name).stem: Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith(suffixes)}


def shipped_or_path(spec: str | Path, shipped: dict[str, Path], what: str) -> Path:
    """A shipped file's name, or a path to a file; one line naming the shipped ones when it is neither."""
    path = shipped.get(str(spec)) or Path(spec)
    if not path.exists():
        names = ", ".join(sorted(shipped)) or "none"
        raise KvbenchError(f"{what} not found: {spec} (not a file, nor a {what} shipped with kvbench: {names})")
    return path


def builtin_datasets() -> dict[str, Path]:
    """Datasets shipped with kvbench (``scenarios/data``), by name."""
    return shipped_files("data", (".json", ".jsonl"))


def resolve_dataset(spec: str | Path) -> Path:
    """A shipped dataset's name (``real-chat``) or a path to a file."""
    return shipped_or_path(spec, builtin_datasets(), "dataset")


def read_dataset(path: str | Path) -> DatasetFile:
    """Every readable record of a ShareGPT JSON or prompt JSONL file; unreadable ones counted by reason."""
    source = resolve_dataset(path)
    text = read_text(source, "dataset")
    start = text.lstrip()[:1]
    if start == "[":
        dataset = _read_sharegpt(source, text)
    elif start == "{":
        dataset = _read_jsonl(source, text)
    else:
        raise KvbenchError(
            f"dataset {source} is not JSON: expected a ShareGPT JSON list ('[...]') or JSON lines "
            'of {"prompt": ...} objects'
        )
    if dataset.total == 0:
        raise KvbenchError(f"dataset {source} holds no records")
    if not dataset.records:
        reasons = ", ".join(f"{count} {reason}" for reason, count in dataset.skipped.most_common())
        raise KvbenchError(f"dataset {source}: none of its {dataset.total} records can be used ({reasons})")
    return dataset


def _read_sharegpt(source: Path, text: str) -> DatasetFile:
    try:
        data = json_input.loads(text)
    except json.JSONDecodeError as err:
        raise KvbenchError(f"dataset {source} is not valid JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, list):
        raise KvbenchError(f"dataset {source}: a ShareGPT file is a JSON list of conversations")
    dataset = DatasetFile(source, "sharegpt", [], len(data))
    for item in data:
        record, problem = _sharegpt_record(item)
        if record is None:
            dataset.skipped[problem] += 1
        else:
            dataset.records.append(record)
    return dataset


def _turn(turn: Any) -> tuple[str, Any]:
    if not isinstance(turn, dict):
        return "", None
    role = turn.get("from", turn.get("role", ""))
    return (role.lower() if isinstance(role, str) else ""), turn.get("value", turn.get("content"))


def _sharegpt_record(item: Any) -> tuple[DatasetRecord | None, str]:
    if not isinstance(item, dict):
        return None, "not a JSON object"
    turns = item.get("conversations", item.get("messages"))
    if not isinstance(turns, list) or not turns:
        return None, "no conversations"
    parsed = [_turn(turn) for turn in turns]
    human = next((index for index, (role, _) in enumerate(parsed) if role in HUMAN_ROLES), None)
    if human is None:
        return None, "no human turn"
    prompt = parsed[human][1]
    if not isinstance(prompt, str) or not prompt.strip():
        return None, "empty human turn"
    answer = None
    for role, value in parsed[human + 1 :]:
        if role in ASSISTANT_ROLES:
            answer = value if isinstance(value, str) and value.strip() else None
            break
        if role in HUMAN_ROLES:
            break
    return DatasetRecord(prompt, answer), ""


def _read_jsonl(source: Path, text: str) -> DatasetFile:
    dataset = DatasetFile(source, "jsonl", [], 0)
    for line in text.splitlines():
        if not line.strip():
            continue
        dataset.total += 1
        try:
            row = json_input.loads(line)
        except json.JSONDecodeError:
            dataset.skipped["not valid JSON"] += 1
            continue
        if not isinstance(row, dict):
            dataset.skipped["not a JSON object"] += 1
            continue
        prompt, output_len = row.get("prompt"), row.get("output_len")
        if not isinstance(prompt, str) or not prompt.strip():
            dataset.skipped["no prompt"] += 1
        elif output_len is not None and (
            isinstance(output_len, bool) or not isinstance(output_len, int) or output_len < 1
        ):
            dataset.skipped["output_len not a positive integer"] += 1
        else:
            dataset.records.append(DatasetRecord(prompt, None, output_len))
    if dataset.total and dataset.skipped["not valid JSON"] == dataset.total:
        raise KvbenchError(f"dataset {source} is not JSON: no line of it parses as a JSON object")
    return dataset


# ---------------------------------------------------------------------------------------------- token counts


class TokenCounter:
    """Token counts (and prompt ids) with a tokenizer, through its chat template when it has one; without
    one, counts of words and punctuation marks."""

    def __init__(self, tokenizer: Any | None = None, model: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.model = model  # the model spec whose tokenizer this is, for the description
        self.chat = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))

    def describe(self) -> str:
        if self.tokenizer is None:
            return "words and punctuation marks (no tokenizer: the model has random weights)"
        name = self.model or getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
        return f"the tokenizer of {Path(str(name)).name}" + (" (chat template)" if self.chat else "")

    def prompt_texts(self, prompts: Sequence[str]) -> list[str]:
        """What the model reads: each prompt as a one-turn chat when the tokenizer has a chat template."""
        if not self.chat:
            return list(prompts)
        assert self.tokenizer is not None  # a chat template comes with a tokenizer
        try:
            return [
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                )
                for p in prompts
            ]
        except Exception as err:  # noqa: BLE001 - a broken template is the checkpoint's, explained in one line
            raise KvbenchError(f"the tokenizer's chat template failed: {err}") from None

    def _encode(self, texts: Sequence[str], special: bool) -> list[Any]:
        """Token ids per text, each a sequence: the fast backend's encodings when there is one (one pass in Rust,
        no offsets), else the tokenizer's lists."""
        assert self.tokenizer is not None  # without one, callers count words instead
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None and hasattr(backend, "encode_batch_fast"):
            return backend.encode_batch_fast(list(texts), add_special_tokens=special)
        return self.tokenizer(list(texts), add_special_tokens=special)["input_ids"]

    def lengths(self, texts: Sequence[str], prompts: bool) -> list[int]:
        """Token counts; a prompt's include the special tokens the model reads (a chat template writes its own)."""
        if not texts:
            return []
        if self.tokenizer is None:
            return [len(WORD_PATTERN.findall(text)) for text in texts]
        return [len(encoding) for encoding in self._encode(texts, prompts and not self.chat)]

    def prompts(self, texts: Sequence[str]) -> tuple[list[int], list[Any] | None]:
        """Prompt token counts, and their encodings (None without a tokenizer), from one pass over the texts."""
        if self.tokenizer is None or not texts:
            return self.lengths(texts, prompts=True), None
        encodings = self._encode(texts, not self.chat)
        return [len(encoding) for encoding in encodings], encodings


# ---------------------------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class DatasetRequest:
    prompt_len: int
    output_len: int | None  # the reference answer's length in tokens; None when the record has none
    prompt_token_ids: list[int] | None = None  # with a tokenizer
    prompt: str | None = None  # the record's prompt as written (before any chat template)


@dataclass
class DatasetSample:
    """The requests drawn from a dataset, and a record of how (for the summary)."""

    requests: list[DatasetRequest]
    path: Path
    format: str
    counted_by: str
    total: int
    usable: int  # records that passed the filters
    skipped: dict[str, int]  # unreadable records, by reason
    dropped: dict[str, int]  # readable records filtered out, by reason
    with_replacement: bool = False

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return [(r.prompt_len, r.output_len or 0) for r in self.requests]

    def note(self) -> str:
        """One sentence: what was kept, skipped and dropped."""
        return sample_note(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "records": self.total,
            "usable": self.usable,
            "requests": len(self.requests),
            "with_replacement": self.with_replacement,
            "skipped_records": dict(self.skipped),
            "dropped_records": dict(self.dropped),
            "counted_by": self.counted_by,
        }


def left_out(record: Mapping[str, Any]) -> str:
    """What a draw left out, from :meth:`DatasetSample.as_dict` (a run's ``meta.dataset``): "" when nothing."""
    lost = {
        **{f"unreadable ({k})": v for k, v in (record.get("skipped_records") or {}).items()},
        **(record.get("dropped_records") or {}),
    }
    return ", ".join(f"{count} {reason}" for reason, count in lost.items())


def sample_note(record: Mapping[str, Any]) -> str:
    """One sentence from :meth:`DatasetSample.as_dict` (a run's ``meta.dataset``): what was kept, skipped and
    dropped, and how lengths were counted."""
    parts = [
        f"{record.get('requests')} requests from {record.get('usable')} of the {record.get('records')} records "
        f"of {Path(str(record.get('path'))).name}"
    ]
    if record.get("with_replacement"):
        parts.append("drawn with replacement")
    if lost := left_out(record):
        parts.append(f"left out: {lost}")
    return "; ".join(parts) + f"; lengths counted in {record.get('counted_by')}"


def sample_dataset(
    path: str | Path,
    counter: TokenCounter,
    max_len: int,
    count: int | None = None,
    seed: int = 0,
    need_output: bool = True,
    min_tokens: int = MIN_TOKENS,
) -> DatasetSample:
    """Read, count, filter and draw ``count`` requests (all usable records, in file order, when None).

    Dropped: prompts or answers under ``min_tokens``; prompt + answer over ``max_len``; records without an
    answer length. Without ``need_output`` (a real model decides where answers end) the reference answers
    play no part: only prompts under ``min_tokens``, or leaving fewer than ``min_tokens`` of room, are dropped.
    """
    dataset = read_dataset(path)
    records = dataset.records
    texts = counter.prompt_texts([r.prompt for r in records])
    prompt_lens, encodings = counter.prompts(texts)
    answers = [(i, r.answer) for i, r in enumerate(records) if r.output_len is None and r.answer is not None]
    answer_lens = dict(
        zip([i for i, _ in answers], counter.lengths([a for _, a in answers], prompts=False), strict=True)
    )
    kept: list[int] = []
    outputs: list[int | None] = []
    dropped: Counter = Counter()
    for index, record in enumerate(records):
        prompt = prompt_lens[index]
        output = record.output_len if record.output_len is not None else answer_lens.get(index)
        judged = output if need_output else None  # the length the filters see
        if output is None and need_output:
            dropped["without an answer length"] += 1
        elif prompt < min_tokens or (judged is not None and judged < min_tokens):
            dropped[f"shorter than {min_tokens} tokens"] += 1
        elif prompt + (judged if judged is not None else min_tokens) > max_len:
            dropped[f"longer than max-len {max_len}"] += 1
        else:
            kept.append(index)
            outputs.append(output)
    if not kept:
        lost = ", ".join(f"{n} {reason}" for reason, n in dropped.items())
        raise KvbenchError(
            f"dataset {dataset.path}: no record is left after filtering ({lost}); raise max-len or use another dataset"
        )
    chosen, replace = _draw(len(kept), count, seed)
    picked = [kept[i] for i in chosen]
    requests = [
        DatasetRequest(
            prompt_lens[i], outputs[j], _ids(encodings[i]) if encodings is not None else None, records[i].prompt
        )
        for i, j in zip(picked, chosen, strict=True)
    ]
    return DatasetSample(
        requests,
        dataset.path,
        dataset.format,
        counter.describe(),
        dataset.total,
        len(kept),
        dict(dataset.skipped),
        dict(dropped),
        replace,
    )


def _ids(encoding: Any) -> list[int]:
    ids = getattr(encoding, "ids", encoding)
    return list(ids)


def _draw(available: int, count: int | None, seed: int) -> tuple[list[int], bool]:
    """Indices of ``count`` seeded draws: shuffled passes over the records, one after another, so each record
    comes once before any comes twice, and the first n draws are the same whatever ``count`` is (the points of
    a sweep use prefixes of one list)."""
    if count is None:
        return list(range(available)), False
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    while len(chosen) < count:
        chosen += [int(i) for i in rng.permutation(available)]
    return chosen[:count], count > available
