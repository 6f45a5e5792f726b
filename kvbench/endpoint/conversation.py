"""What the load generator sends: conversations of one or more turns.

A single request is a conversation of one turn. A multi-turn conversation resends its history with each turn,
as a chat client does: turn k carries every earlier user turn with the answer the server gave to it, then the
new user turn. Turn k + 1 cannot be written before turn k's answer is back, so the turns of one conversation
are sent one after another; the load patterns keep conversations, not turns, side by side.

Prompts are text or token ids. Token ids replay exactly the tokens kvbench's own engines run (``completions``
only); a conversation of several turns needs text, since its history holds the server's answers as text, unless
its turns come from a trace (each turn's ``at_s`` set): a trace's prompt already holds its session's history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Turn:
    prompt: str | tuple[int, ...]  # what the user sends this turn: text, or token ids
    max_tokens: int  # the reference output length of this turn
    prompt_len: int | None = None  # tokens of this turn's prompt as the workload counted them; None: unknown
    ignore_eos: bool = False  # run to max_tokens (where the server accepts ignore_eos)
    at_s: float | None = None  # a trace's: when it is sent, seconds from the load's start (and not before the
    # turn before it is answered); its prompt is then whole, the session's history already in it

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not isinstance(self.prompt, str):
            object.__setattr__(self, "prompt", tuple(self.prompt))
            if not self.prompt:
                raise ValueError("a turn's prompt holds no token")
            if self.prompt_len is None:
                object.__setattr__(self, "prompt_len", len(self.prompt))
        elif not self.prompt:
            raise ValueError("a turn's prompt is empty")


@dataclass(frozen=True)
class Conversation:
    index: int
    turns: tuple[Turn, ...]
    system: str | None = None  # a system message (chat) or text before the first turn (completions)
    group: int | None = None  # the shared-prefix group it belongs to, if any

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", tuple(self.turns))
        if not self.turns:
            raise ValueError("a conversation needs at least one turn")
        replayed = all(t.at_s is not None for t in self.turns)
        if len(self.turns) > 1 and not replayed and not all(isinstance(t.prompt, str) for t in self.turns):
            raise ValueError(
                "a conversation of several turns needs text prompts (its history holds the answers as text)"
            )
        if self.system is not None and not all(isinstance(t.prompt, str) for t in self.turns):
            raise ValueError("a system text needs text prompts")

    @property
    def token_ids(self) -> bool:
        return not isinstance(self.turns[0].prompt, str)

    def completion_prompt(self, turn: int, answers: Sequence[str]) -> str | list[int]:
        """The ``prompt`` of turn ``turn`` for ``/v1/completions``: the history as one text (each answer
        continues the text it answered; a new user turn starts on a new line), or the token ids."""
        current = self.turns[turn].prompt
        if not isinstance(current, str):
            return list(current)
        parts = [self.system] if self.system else []
        for earlier, answer in zip(self.turns[:turn], answers, strict=False):
            parts += [str(earlier.prompt), answer, "\n"]
        parts.append(current)
        return "".join(parts)

    def chat_messages(self, turn: int, answers: Sequence[str]) -> list[dict[str, str]]:
        """The ``messages`` of turn ``turn`` for ``/v1/chat/completions``."""
        if self.token_ids:
            raise ValueError("a chat request needs text; these prompts are token ids")
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for earlier, answer in zip(self.turns[:turn], answers, strict=False):
            messages += [{"role": "user", "content": str(earlier.prompt)}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": str(self.turns[turn].prompt)})
        return messages


def request_count(conversations: Sequence[Conversation]) -> int:
    return sum(len(c.turns) for c in conversations)
