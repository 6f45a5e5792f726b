"""A choice's output text as tokens arrive: incremental decoding and stop strings.

Decoding token by token must not split a character (a byte-level BPE spells one over several tokens) nor drop
the space a SentencePiece token carries at its start, so the text of the newest tokens is read as the difference
between two decodes that share a few earlier tokens (the prompt's last ones at first), and held back while it
ends in an unfinished character. This is the method of Hugging Face's text streamer and of vLLM.

Stop strings: the text is cut before the first stop string found (kept with ``include_stop_str_in_output``), and
the choice ends with ``finish_reason`` "stop" and the string as its ``stop_reason``. The token that completed
it is the last one counted. While streaming, the last ``len(longest stop) - 1`` characters wait until the
next tokens show they do not begin a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PROMPT_CONTEXT = 5  # prompt tokens decoded before the first output token (vLLM keeps 5 too)


class TextStream:
    """The text of one choice; ``add`` takes its new tokens and returns how many of them count."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int],
        stop_strings: Sequence[str] = (),
        include_stop: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT:])
        self._prefix = 0  # ids[prefix:read] were decoded already; their text is the base of the next delta
        self._read = len(self.ids)
        self.stop_strings = tuple(stop_strings)
        self.include_stop = include_stop
        self.skip_special = skip_special_tokens
        self._holdback = max((len(s) for s in self.stop_strings), default=1) - 1  # what may begin a stop
        self.text = ""  # the output text so far (cut at a stop string once one is found)
        self.sent = 0  # characters of ``text`` already handed out by ``take``
        self.stopped: str | None = None  # the stop string that ended the choice

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special, clean_up_tokenization_spaces=False)

    def _advance(self, final: bool) -> str:
        """New text of the tokens added since the last advance (all of it when ``final``)."""
        if self._read == len(self.ids):
            return ""
        base = self._decode(self.ids[self._prefix : self._read])
        full = self._decode(self.ids[self._prefix :])
        if len(full) <= len(base) or (full.endswith("\ufffd") and not final):
            return ""  # an unfinished character, or a token without text (a special one): wait for more
        self._prefix, self._read = self._read, len(self.ids)
        return full[len(base) :]

    def add(self, tokens: Sequence[int], final: bool = False) -> int:
        """Take a choice's new tokens; returns how many count (fewer when a stop string ended the choice)."""
        if self.tokenizer is None or self.stopped is not None:
            return 0 if self.stopped is not None else len(tokens)
        if not self.stop_strings:
            self.ids.extend(tokens)
            self.text += self._advance(final)
            return len(tokens)
        for count, token in enumerate(tokens, start=1):  # token by token: the one that completes a stop counts
            self.ids.append(token)
            delta = self._advance(final and count == len(tokens))
            if delta and self._find_stop(delta):
                return count
        return len(tokens)

    def _find_stop(self, delta: str) -> bool:
        start = max(0, len(self.text) - self._longest_stop() + 1)
        self.text += delta
        best: tuple[int, str] | None = None
        for stop in self.stop_strings:
            where = self.text.find(stop, start)
            if where >= 0 and (best is None or where < best[0]):
                best = (where, stop)
        if best is None:
            return False
        where, stop = best
        self.text = self.text[: where + len(stop) if self.include_stop else where]
        self.stopped = stop
        return True

    def _longest_stop(self) -> int:
        return max(len(s) for s in self.stop_strings)

    def finish(self) -> None:
        """The choice ended: decode what was held back for an unfinished character."""
        if self.tokenizer is not None and self.stopped is None:
            tail = self._advance(final=True)
            if tail and self.stop_strings:
                self._find_stop(tail)
            else:
                self.text += tail

    def take(self, done: bool) -> str:
        """Text not handed out yet; while not ``done``, what could still begin a stop string waits."""
        end = len(self.text) if done or self.stopped is not None else max(self.sent, len(self.text) - self._holdback)
        piece = self.text[self.sent : end]
        self.sent = end
        return piece
