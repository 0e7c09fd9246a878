"""Incremental detokenization: decode only the window since the last character boundary, not each token alone (BPE
splits characters; sentencepiece decodes a leading token differently); text ending in U+FFFD waits to complete."""
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
        self._read = 0

    def push(self, new_tokens: list[int]) -> str:
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
        """The final text, held-back tokens included (U+FFFD for a character that never completed)."""
        return self.text + self.tail
