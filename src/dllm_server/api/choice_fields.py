"""The computed fields of a response's choices: usage, the `dllm` summary and `logprobs`."""
from __future__ import annotations

from . import logprobs as lp


def usage(outputs, n: int) -> dict:
    p = sum(len(o.prompt_token_ids) for o in outputs[::n])      # each prompt once, as OpenAI counts
    c = sum(len(o.token_ids) for o in outputs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def dllm_summary(o, req, handle, default_slo_ms: float | None) -> dict:
    """The diffusion side of a finished choice: forwards, blocks, the block width, the threshold each block ran
    with, and (when the request had an SLO, its own or the server's default) whether it met it."""
    s = o.stats
    out = {"forwards": s.num_forwards, "blocks": s.num_blocks_run, "steps_per_block": s.steps_per_block,
           "tokens_per_forward": round(o.tokens_per_forward, 4), "block_length": handle.block_length,
           "thresholds": [p.threshold for p in s.block_policies]}
    if req.edit_threshold is not None:
        out["edits"] = s.num_edits
    if s.constrained_forwards:      # structured output: what keeping the canvas completable cost
        out["constraint"] = {"forwards": s.constrained_forwards, "dp_ms": round(s.constraint_ms, 2),
                             "dp_ms_per_forward": round(s.constraint_ms / s.constrained_forwards, 3)}
    slo_ms = req.slo_ms if req.slo_ms is not None else default_slo_ms
    if slo_ms is not None and s.latency_s is not None:
        out.update({"slo_ms": slo_ms, "latency_ms": round(1e3 * s.latency_s, 1), "slo_met": 1e3 * s.latency_s <= slo_ms})
    return out


def logprobs(token_ids: list[int], entries: list | None, chat: bool, tokenizer, text_offset: int = 0) -> dict | None:
    """The choice's `logprobs` for these tokens (None when the request did not ask)."""
    if entries is None:
        return None
    tokens, name = list(zip(token_ids, entries)), lp.token_namer(tokenizer)
    return {"content": lp.chat_content(tokens, name)} if chat else lp.completion_logprobs(tokens, name, text_offset)
