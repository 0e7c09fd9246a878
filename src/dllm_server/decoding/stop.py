"""When is a request's visible answer final? (EOS / end-of-turn early stop, length limit.)"""
from __future__ import annotations

import torch


def visible_len(answer: torch.Tensor, stop_token_ids: torch.Tensor, max_tokens: int,
                ignore_eos: bool) -> int:
    """Length of the answer a client may see: up to the first committed stop token
    (exclusive), capped at max_tokens."""
    if not ignore_eos and stop_token_ids.numel():
        hits = torch.isin(answer[:max_tokens], stop_token_ids).nonzero()
        if hits.numel():
            return int(hits[0, 0])
    return min(max_tokens, answer.numel())


def is_final(answer: torch.Tensor, mask_id: int, stop_token_ids: torch.Tensor, max_tokens: int,
             ignore_eos: bool) -> bool:
    """True when nothing the client can see is still masked, so no further forward can change
    the output: later blocks are skipped (dInfer-style early stop, made exact)."""
    n = visible_len(answer, stop_token_ids, max_tokens, ignore_eos)
    return not bool((answer[:n] == mask_id).any())
