"""Naive reference implementations used as test oracles (deliberately simple: full forwards, or a dense cache)."""
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


def _dream_forward(model, canvas: torch.Tensor, lo: int, hi: int, cache: list | None,
                   causal: bool) -> tuple[torch.Tensor, list]:
    """Dream layers over canvas[lo:hi], written plainly with a dense K/V cache: the fed positions'
    fresh K/V replace the cache's rows [lo, hi) (a full forward fills it); queries attend to
    every canvas position, through explicit float64 softmax(q k^T / sqrt(d)) v. Returns the fed
    positions' logits (unshifted) and the cache."""
    a = model.args
    n = canvas.numel()
    x = canvas[lo:hi]
    h = model.model.embed_tokens(x)
    cos, sin = model.rotary.tables(torch.arange(lo, hi), h.dtype)
    cache = cache if cache is not None else [None] * a.num_layers
    for i, layer in enumerate(model.model.layers):
        att = layer.self_attn
        y = layer.input_layernorm(h)
        q, k, v = att.project_qkv(y, cos, sin)
        if cache[i] is None:
            cache[i] = (torch.zeros(n, *k.shape[1:], dtype=k.dtype), torch.zeros(n, *v.shape[1:], dtype=v.dtype))
        keys, values = cache[i]
        keys[lo:hi], values[lo:hi] = k, v
        rep = a.num_heads // a.num_kv_heads
        kk, vv = keys.repeat_interleave(rep, dim=1).double(), values.repeat_interleave(rep, dim=1).double()
        scores = torch.einsum("qhd,khd->hqk", q.double(), kk) / a.head_dim ** 0.5
        if causal:
            scores = scores.masked_fill(torch.arange(n)[None, None, :] > torch.arange(lo, hi)[None, :, None],
                                        float("-inf"))
        o = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), vv).to(h.dtype)
        h = h + att.o_proj(o.flatten(1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = model.model.norm(h)
    logits = h @ model.model.embed_tokens.weight.T if a.tie_embeddings else model.lm_head(h)
    return logits[:, : a.vocab_size].double(), cache


def dream_block_reference(model, prompt: list[int], answer_len: int, block_len: int, threshold: float,
                          mode: str, causal: bool = False) -> list[int]:
    """Fast-dLLM's Dream block sampler (confidence threshold, greedy) under the prefix or dual
    cache, written from its description: per block, one full forward fills the cache, its logits
    shifted right by one (token i from output i-1), and commits only the block's first position;
    then each cached step feeds [s, L) (prefix) or [s, e) (dual), every other position (the one
    before the block too) keeping its K/V from that full forward, shifts the logits inside the
    fed window (position s from its own output) and commits every masked block position whose
    confidence reaches the threshold, at least the most confident. The mask token is never
    proposed (as our sampler)."""
    a = model.args
    p = len(prompt)
    x = torch.full((p + answer_len,), a.mask_id, dtype=torch.int64)
    x[:p] = torch.tensor(prompt)
    n = x.numel()
    with torch.inference_mode():
        for s in range(p, n, block_len):
            e = s + block_len
            logits, cache = _dream_forward(model, x, 0, n, None, causal)
            logits[:, a.mask_id] = float("-inf")
            x[s] = logits[s - 1].argmax()
            while bool((x[s:e] == a.mask_id).any()):
                hi = e if mode == "dual" else n
                win, cache = _dream_forward(model, x, s, hi, cache, causal)
                win = torch.cat([win[:1], win[:-1]])[: e - s]
                win[:, a.mask_id] = float("-inf")
                probs = torch.softmax(win, dim=-1)
                conf, tok = probs.max(dim=-1)
                masked = x[s:e] == a.mask_id
                conf = torch.where(masked, conf, torch.full_like(conf, -1.0))
                take = masked & (conf >= threshold)
                take[int(conf.argmax())] = True
                x[s:e] = torch.where(take, tok, x[s:e])
    return x[p:].tolist()
