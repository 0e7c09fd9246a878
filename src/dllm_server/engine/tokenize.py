"""Tokenizer, chat template and the ids that end an answer (EOS and end-of-turn)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

END_OF_TURN_TOKENS = ("<|eot_id|>", "<|im_end|>")


class Tokenizer:
    def __init__(self, folder: str | Path):
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        folder = Path(folder)
        if (folder / "tokenizer.json").is_file():
            self.hf = PreTrainedTokenizerFast.from_pretrained(str(folder))
        else:
            try:
                self.hf = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
            except Exception as exc:
                raise ValueError(f"model: cannot load a tokenizer from {folder} ({exc}); pass "
                                 "skip_tokenizer_init=True and token-id prompts") from exc
        self.vocab_size = len(self.hf)
        # The most characters one token can stand for: a token's string is at least as long as
        # the text it covers (byte-level: one character per byte; specials match literally).
        self.max_token_chars = max(1, max(map(len, self.hf.get_vocab()), default=1))
        # Progress streams name every committed token; a few ids recur, so remember them (bounded).
        self.token_text = functools.lru_cache(maxsize=1 << 16)(self._token_text)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=True))

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        if not self.hf.chat_template:
            raise ValueError("messages: this model's tokenizer has no chat template")
        text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already holds BOS; encoding must not add a second one.
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=True)

    def _token_text(self, token_id: int) -> str:
        """One token's own text, special tokens by name. A byte-level token that is only part of
        a UTF-8 character decodes to U+FFFD here."""
        return self.hf.decode([token_id], skip_special_tokens=False)

    def end_of_turn_ids(self) -> set[int]:
        ids = set()
        for tok in END_OF_TURN_TOKENS:
            tid = self.hf.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != self.hf.unk_token_id and tid is not None:
                ids.add(tid)
        if self.hf.eos_token_id is not None:
            ids.add(self.hf.eos_token_id)
        return ids


def stop_token_ids(folder: str | Path, eos_id: int, tokenizer: Tokenizer | None) -> tuple[int, ...]:
    """EOS from config.json and generation_config.json, plus the tokenizer's end-of-turn tokens."""
    ids = {eos_id}
    gen = Path(folder) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer is not None:
        ids |= tokenizer.end_of_turn_ids()
    return tuple(sorted(ids))
