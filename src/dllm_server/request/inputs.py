"""User input to validated prompt token ids (offline LLM and server); failures are ValueErrors naming the field."""
from __future__ import annotations

from typing import Any

from ..decoding.params import DecodeParams, SamplingParams
from ..messages import ModelInfo
from .tokenize import Tokenizer


def prompt_ids(prompt: Any, tokenizer: Tokenizer | None) -> tuple[str | None, list[int]]:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt: text prompts need a tokenizer (skip_tokenizer_init is set)")
        if not prompt:
            raise ValueError("prompt: must not be empty")
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        ids = prompt["prompt_token_ids"]
        if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError("prompt_token_ids: must be a list of integers")
        return prompt.get("prompt"), list(ids)
    raise ValueError(f"prompt: must be a string or {{'prompt_token_ids': [...]}}, got {type(prompt).__name__}")


NFC_MAX_MERGE = 4   # NFC composes at most 4 code points into one (U+1F82: alpha + three combining marks)


def input_chars(prompt: Any, messages: list[dict] | None) -> int:
    """Characters the tokenizer will see at least (chat contents stripped, as templates trim); 0 for token ids."""
    if messages is not None:
        return sum(len(m["content"].strip()) for m in messages if isinstance(m.get("content"), str))
    return len(prompt) if isinstance(prompt, str) else 0


def check_prompt_chars(num_chars: int, max_len: int, max_token_chars: int, field: str) -> None:
    """Refuse, before tokenizing, an input too long for the context even at `max_token_chars` per token."""
    limit = max_len * max_token_chars * NFC_MAX_MERGE
    if num_chars > limit:
        raise ValueError(f"{field}: {num_chars} characters cannot fit the model context of {max_len} tokens "
                         f"(this tokenizer needs a token per {max_token_chars} characters at most; the limit is "
                         f"{limit} characters)")


def check_request(ids: list[int], params: SamplingParams, resolved: DecodeParams, args: ModelInfo) -> None:
    """The ids and request against the model's limits (length first: the other checks are linear in it)."""
    if not ids:
        raise ValueError("prompt: must not be empty")
    if len(ids) >= args.max_len:
        raise ValueError(f"prompt: {len(ids)} tokens leave no room for an answer: it exceeds the model context "
                         f"of {args.max_len}")
    bad = [i for i in ids if not 0 <= i < args.vocab_size]
    if bad:
        raise ValueError(f"prompt_token_ids: ids {bad[:5]} are outside the vocabulary [0, {args.vocab_size})")
    if args.mask_id in ids:
        raise ValueError(f"prompt_token_ids: contains the mask token id {args.mask_id}")
    canvas = len(ids) + resolved.answer_len(len(ids))
    if canvas > args.max_len:
        raise ValueError(f"max_tokens: prompt ({len(ids)} tokens) + answer ({params.max_tokens} tokens, "
                         f"rounded up to whole blocks of {resolved.block_length}) = {canvas} exceeds the "
                         f"model context of {args.max_len}")
