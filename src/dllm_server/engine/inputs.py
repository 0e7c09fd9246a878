"""Turning user input into validated prompt token ids (shared by the offline LLM and the server).

Every failure is a ValueError that names the offending field."""
from __future__ import annotations

from typing import Any

from ..decoding.canvas import answer_len, validate_steps
from ..decoding.params import DecodeParams, SamplingParams
from ..messages import ModelInfo
from .tokenize import Tokenizer


def prompt_ids(prompt: Any, tokenizer: Tokenizer | None) -> tuple[str | None, list[int]]:
    """A prompt is a string or {"prompt_token_ids": [...]}."""
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


def check_request(ids: list[int], params: SamplingParams, resolved: DecodeParams, args: ModelInfo) -> None:
    """The prompt ids and the request against the model's limits."""
    if not ids:
        raise ValueError("prompt: must not be empty")
    bad = [i for i in ids if not 0 <= i < args.vocab_size]
    if bad:
        raise ValueError(f"prompt_token_ids: ids {bad[:5]} are outside the vocabulary [0, {args.vocab_size})")
    if args.mask_id in ids:
        raise ValueError(f"prompt_token_ids: contains the mask token id {args.mask_id}")
    canvas = len(ids) + answer_len(resolved.max_tokens, resolved.block_length)
    if canvas > args.max_len:
        raise ValueError(f"max_tokens: prompt ({len(ids)} tokens) + answer ({params.max_tokens} tokens, "
                         f"rounded up to whole blocks of {resolved.block_length}) = {canvas} exceeds the "
                         f"model context of {args.max_len}")
    if params.steps is not None:
        validate_steps(params.steps, resolved.max_tokens, resolved.block_length)
