"""Client-side token counting: an optional real tokenizer, else a documented heuristic.

Owns: loading ``--tokenizer PATH`` (a ``tokenizer.json`` file or a folder holding one, read with
``tokenizers``; other Hugging Face folders via ``transformers.AutoTokenizer``, with
``PreTrainedTokenizerFast`` as fallback), and the rule that decides whether a client-side count
disagrees with the server's ``usage.completion_tokens``.

Without a tokenizer the count is an estimate: ``ceil(len(text) / 4)`` characters-per-token (the
usual rule of thumb for English BPE vocabularies). Estimates are only flagged as mismatches when
they are off by more than a factor of 2; real tokenizer counts are flagged on any difference.
"""
from __future__ import annotations

import math
from pathlib import Path

CHARS_PER_TOKEN = 4.0


class TokenCounter:
    """Counts tokens of generated text and builds prompts of a target token length."""

    def __init__(self, tokenizer=None, name: str | None = None):
        self._tok = tokenizer
        self.name = name

    @property
    def exact(self) -> bool:
        return self._tok is not None

    @property
    def method(self) -> str:
        return f"tokenizer:{self.name}" if self.exact else "chars/4"

    def encode(self, text: str) -> list[int]:
        if self._tok is None:
            raise RuntimeError("no tokenizer loaded")
        enc = self._tok.encode(text, add_special_tokens=False)
        return list(enc.ids) if hasattr(enc, "ids") else list(enc)

    def decode(self, ids: list[int]) -> str:
        if self._tok is None:
            raise RuntimeError("no tokenizer loaded")
        return self._tok.decode(ids)

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self._tok is not None:
            return len(self.encode(text))
        return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))

    def mismatch(self, client_count: int, usage_count: int | None) -> bool:
        """Whether the client-side count disagrees with the server's usage count."""
        if usage_count is None:
            return False
        if self.exact:
            return client_count != usage_count
        if usage_count == 0 or client_count == 0:
            return usage_count != client_count
        ratio = client_count / usage_count
        return ratio > 2.0 or ratio < 0.5


class _RawTokenizer:
    """Adapter for a bare ``tokenizers.Tokenizer`` so it looks like a HF tokenizer."""

    def __init__(self, tok):
        self._tok = tok

    def encode(self, text: str, add_special_tokens: bool = False):
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids):
        return self._tok.decode(list(ids))


def load_counter(path: str | None) -> TokenCounter:
    """A TokenCounter for ``path`` (None -> heuristic counter)."""
    if not path:
        return TokenCounter()
    p = Path(path)
    raw = p if p.is_file() else p / "tokenizer.json"
    if raw.is_file():
        from tokenizers import Tokenizer

        return TokenCounter(_RawTokenizer(Tokenizer.from_file(str(raw))), name=str(p))
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True, trust_remote_code=False)
    except Exception:  # noqa: BLE001 - fall back to the plain fast tokenizer file
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast(tokenizer_file=str(p / "tokenizer.json"))
    return TokenCounter(tok, name=str(p))
