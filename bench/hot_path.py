"""The model hot path, in-process (no server): the forward of B dual-cache block steps (the decode
iteration of B seated requests) at several batch sizes, and the batch-1 latency of
`LLM.generate`. Meant to run under bench/ab.py against an older commit (`--script-from current`:
it uses only what every tree has), so both sides see the same machine:

    python bench/ab.py --ref c495d1e --rounds 2 --script-from current -- bench/hot_path.py
    python bench/hot_path.py [--model DIR] [--dtype float32] [--batch 1 16 32] [--threads 1]

Medians over repeated runs; the checksum of the generated tokens must match across sides.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import zlib

import torch

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_server import LLM, SamplingParams  # noqa: E402
from common import plain_id_offset, step_items  # noqa: E402  (bench/, the script's folder)


def forward_ms(llm, items, reps: int) -> float:
    for _ in range(3):
        llm.runner.forward(items)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        llm.runner.forward(items)
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded demo model)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 32])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=96)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--requests", type=int, default=8, help="LLM.generate calls at batch 1")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    llm = LLM(a.model, dtype=a.dtype, block_length=a.block)
    canvas_len = a.prompt + 4 * a.block
    result = {}
    print(f"dual-cache block steps: prompt {a.prompt}, block {a.block}, canvas {canvas_len}; {a.dtype}, "
          f"{a.threads} thread(s)\n\n| batch | forward (ms) | per request (ms) |\n|---|---|---|")
    for b in a.batch:
        items = step_items(llm, b, a.prompt, a.block, canvas_len, f"b{b}_")
        ms = forward_ms(llm, items, max(10, 320 // b))
        for i in range(b):
            llm.core.pool.free(f"b{b}_{i}")
        result[f"forward_b{b}_ms"] = ms
        print(f"| {b} | {ms:.2f} | {ms / b:.3f} |", flush=True)
    first = 1 + plain_id_offset(a.model)
    prompts = [list(range(first + i, first + i + 40 + 8 * i)) for i in range(a.requests)]
    params = SamplingParams(max_tokens=a.max_tokens, ignore_eos=True)
    llm.generate({"prompt_token_ids": prompts[0]}, params)          # warm-up
    lat, forwards, crc = [], 0, 0
    for rep in range(3):
        for p in prompts:
            t = time.perf_counter()
            out = llm.generate({"prompt_token_ids": p}, params)[0]
            lat.append(time.perf_counter() - t)
            forwards += out.stats.num_forwards if rep == 0 else 0
            crc = zlib.crc32(json.dumps(out.token_ids).encode(), crc) if rep == 0 else crc
    med = 1e3 * statistics.median(lat)
    result.update(generate_b1_ms=med, generate_forwards=forwards, tokens_crc=crc)
    print(f"\nLLM.generate at batch 1: {a.requests} prompts x 3, {a.max_tokens} tokens each, median {med:.1f} ms "
          f"per request ({forwards} forwards over the {a.requests}; tokens crc32 {crc})")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
