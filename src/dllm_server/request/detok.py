"""Incremental detokenization of a growing token sequence: each call decodes only a short window
(the tokens since the last emitted character boundary), never the whole prefix again, so the
front loop's work per step does not grow with the answer.

Why a window and not each new token alone: byte-level BPE splits multi-byte characters across
tokens, and sentencepiece-style tokenizers decode a token differently at the start of a string
(the leading-space marker). Decoding [prefix_offset:] and subtracting the decode of
[prefix_offset:read_offset] gives the text the new tokens add in context; a result ending in
U+FFFD is an incomplete character and is held back until the next tokens complete it.
"""
from __future__ import annotations

from typing import Callable

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.tokens: list[int] = []
        self.text = ""                   # stable text: never changes once emitted
        self.tail = ""                   # what the held-back tokens decode to for now (may change)
        self._prefix = 0                 # window start (a character boundary)
        self._read = 0                   # tokens already turned into `text`

    def push(self, new_tokens: list[int]) -> str:
        """Append tokens; returns the text they complete (possibly "")."""
        if not new_tokens:
            return ""
        self.tokens.extend(new_tokens)
        window = self.tokens[self._prefix:]
        before = self.decode(self.tokens[self._prefix:self._read]) if self._read > self._prefix else ""
        now = self.decode(window)
        if len(now) <= len(before) or now.endswith(REPLACEMENT):
            self.tail = now[len(before):]
            return ""
        added = now[len(before):]
        self.text += added
        self.tail = ""
        self._prefix, self._read = self._read, len(self.tokens)
        return added

    def flush(self) -> str:
        """The final text: whatever the held-back tokens decode to (U+FFFD for a character that
        never completed), as a full decode of all tokens would show it."""
        return self.text + self.tail
