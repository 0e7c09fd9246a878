"""Naive reference implementations used as test oracles (deliberately simple, no cache)."""
from __future__ import annotations

import torch

from dllm_server.model.attention import DenseBatch


def full_logits(model, canvas: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """One plain forward over the whole canvas -> logits [L, vocab] aligned so row i predicts token i."""
    n = canvas.numel()
    with torch.inference_mode():
        logits = model(canvas, torch.arange(n), DenseBatch(1, causal), None, torch.arange(n))
    logits = logits[:, : model.args.vocab_size].double()
    if model.args.logit_shift:
        logits = torch.cat([logits[:1], logits[:-1]])   # Dream: token i from hidden state i-1
    return logits


def reference_generate(model, prompt: list[int], answer_len: int, block_len: int, steps: int,
                       causal: bool = False) -> list[int]:
    """LLaDA `generate`: a full forward per step, the fixed schedule, low-confidence top-k commits."""
    a = model.args
    p = len(prompt)
    x = torch.full((p + answer_len,), a.mask_id, dtype=torch.int64)
    x[:p] = torch.tensor(prompt)
    n_blocks = answer_len // block_len
    for b in range(n_blocks):
        s, e = p + b * block_len, p + (b + 1) * block_len
        n_steps = steps // n_blocks + (1 if b < steps % n_blocks else 0)
        counts = [block_len // n_steps + (1 if i < block_len % n_steps else 0) for i in range(n_steps)]
        for k in counts:
            logits = full_logits(model, x, causal)
            logits[:, a.mask_id] = float("-inf")
            x0 = logits.argmax(-1)
            conf = torch.softmax(logits, -1).gather(-1, x0[:, None]).squeeze(-1)
            conf[:s] = float("-inf")
            conf[e:] = float("-inf")
            conf[x != a.mask_id] = float("-inf")
            idx = torch.topk(conf, k).indices
            x[idx] = x0[idx]
    return x[p:].tolist()
