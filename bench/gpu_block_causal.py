"""The block-causal phase of bench/gpu.py: an SDAR-shaped checkpoint (Qwen3 layout, block-causal attention,
exact KV) decoded offline with the fused finalise, the separate one and the full no-cache recompute; answers
must agree, the prefix cache must skip shared prompt blocks, and the forwards and time per answer are timed."""
from __future__ import annotations

import random
import tempfile
from pathlib import Path

import torch

from bench.harness import Timer
from dllm_server import LLM, SamplingParams
from dllm_server.model.tiny import make_tiny_model

# GPU: a 1.7B-class width at 4 layers (head_dim 128, GQA 16/8), block 4 as SDAR ships; smoke: tiny shapes.
GPU_SHAPE = dict(hidden=2048, layers=4, heads=16, kv_heads=8, mlp=6144, head_dim=128, block_size=4, max_len=2048)
SMOKE_SHAPE = dict(hidden=64, layers=2, heads=4, kv_heads=2, mlp=128, head_dim=16, block_size=4, max_len=512)
MODES = ("fused", "separate", "recompute")


def block_causal_check(device: torch.device, dtype: torch.dtype, smoke: bool, seed: int, seconds_left) -> dict:
    """Decodes the same requests under each finalise mode (float32 unless the run's dtype is wider: the exact-KV
    comparison needs no bf16 rounding noise) and the shared-prefix requests with the prefix cache on."""
    shape = SMOKE_SHAPE if smoke else GPU_SHAPE
    check_dtype = "float64" if dtype == torch.float64 else "float32"
    folder = Path(tempfile.mkdtemp(prefix="dllm-gpu-sdar-"))
    with Timer() as t:
        ckpt = make_tiny_model(folder / "sdar", arch="sdar", seed=seed, dtype="float32", **shape)
    rng = random.Random(seed)
    n, prompt_len, answer = (4, 24, 16) if smoke else (16, 256, 128)
    prompts = [{"prompt_token_ids": [rng.randrange(10, 200) for _ in range(prompt_len)]} for _ in range(n)]
    params = SamplingParams(max_tokens=answer, threshold=0.9, ignore_eos=True)
    out = {"shape": shape, "dtype": check_dtype, "checkpoint_write_s": t.s, "requests": n, "prompt": prompt_len,
           "max_tokens": answer, "runs": {}}
    tokens = {}
    for mode in MODES:
        if seconds_left() < 0:
            out["skipped"] = f"time budget before {mode}"
            break
        llm = LLM(str(ckpt), dtype=check_dtype, device=device.type, block_causal_finalise=mode)
        llm.generate(prompts[:1], params)                      # warm-up (allocator, kernels)
        f0 = llm.core.stepper.num_forwards
        with Timer() as t:
            outs = llm.generate(prompts, params)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        tokens[mode] = [o.token_ids for o in outs]
        out["runs"][mode] = {"seconds": t.s, "forwards": llm.core.stepper.num_forwards - f0,
                             "forwards_per_answer": sum(o.stats.num_forwards for o in outs) / n,
                             "output_tok_s": sum(len(o.token_ids) for o in outs) / t.s}
        del llm
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "fused" in tokens:
        out["agree_with_fused"] = {m: sum(a == b for a, b in zip(tokens[m], tokens["fused"])) / n
                                   for m in tokens if m != "fused"}
    shared = [{"prompt_token_ids": prompts[0]["prompt_token_ids"] + [rng.randrange(10, 200) for _ in range(8)]}
              for _ in range(n)]
    if seconds_left() > 0:
        llm = LLM(str(ckpt), dtype=check_dtype, device=device.type)
        cache = llm.core.prefix_cache
        llm.generate(shared[:1], params)
        hit0 = cache.hit_tokens if cache is not None else 0
        with Timer() as t:
            again = llm.generate(shared[1:], params)
        hits = (cache.hit_tokens if cache is not None else 0) - hit0
        out["prefix_cache"] = {"requests": n - 1, "shared_prompt_tokens": prompt_len, "hit_tokens": hits,
                               "seconds": t.s, "forwards_per_answer": sum(o.stats.num_forwards for o in again) / (n - 1)}
    agree = out.get("agree_with_fused", {})
    out["ok"] = bool(agree) and all(v == 1.0 for v in agree.values()) and \
        out.get("prefix_cache", {}).get("hit_tokens", 0) > 0
    return out
