"""Decoding benchmark (offline engine): batch-1 latency and tokens per forward for the three cache
modes, and the cost of one cached block step against a full-canvas forward, measured in one run;
the dual step also through the fixed-shape path that CUDA workers replay as graphs (run eagerly
here unless the model is on CUDA).

    python bench/decoding.py [--model DIR] [--prompt-len 256] [--max-tokens 128]
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import tempfile
import time

import torch

from dllm_server import LLM, SamplingParams
from dllm_server.model.tiny import make_tiny_model
from dllm_server.worker.cuda_graph import DecodeGraphs
from dllm_server.worker.runner import ForwardItem, ModelRunner, fed_range


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint folder (default: a seeded random 4-layer d=256 LLaDA)")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = args.model or str(make_tiny_model(tempfile.mkdtemp(), arch="llada", hidden=256, layers=4,
                                             heads=4, mlp=704, seed=0))
    prompt = {"prompt_token_ids": [(i * 37) % 250 + 1 for i in range(args.prompt_len)]}
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    print(f"model={path} dtype={args.dtype} threads={args.threads} machine={platform.processor() or platform.machine()}"
          f" torch={torch.__version__}")
    print(f"prompt_len={args.prompt_len} max_tokens={args.max_tokens} block_length={args.block_length} "
          f"threshold=0.9 greedy, median of {args.repeats}")
    print()
    print("| cache | latency (s) | forwards | tokens / forward | output tok/s |")
    print("|---|---|---|---|---|")
    llm = None
    for cache in ("none", "prefix", "dual"):
        llm = LLM(path, cache=cache, block_length=args.block_length, dtype=args.dtype)
        llm.generate(prompt, params)   # warm-up
        out = None

        def run():
            nonlocal out
            out = llm.generate(prompt, params)[0]
        t = median_time(run, args.repeats)
        print(f"| {cache} | {t:.3f} | {out.stats.num_forwards} | {out.tokens_per_forward:.2f} | "
              f"{len(out.token_ids) / t:.1f} |")

    # One block step vs a full forward over the same canvas, batch 1 and 16.
    core = llm.core
    dev = core.pool.device
    fixed = ModelRunner(llm.runner.model, llm.args, core.pool, dev,
                        decode_graphs=DecodeGraphs(llm.runner.model, llm.args, core.pool, dev, 16,
                                                   capture=dev.type == "cuda"))
    canvas_len = args.prompt_len + args.max_tokens
    print()
    print(f"| batch | full forward {canvas_len} tok (ms) | prefix step (ms) | dual step {args.block_length} tok (ms) "
          f"| full / dual | dual step, fixed-shape path (ms) |")
    print("|---|---|---|---|---|---|")
    for batch in (1, 16):
        items = {m: [] for m in ("full", "prefix", "dual")}
        for b in range(batch):
            canvas = torch.full((canvas_len,), llm.args.mask_id, dtype=torch.int64)
            canvas[: args.prompt_len] = torch.tensor(prompt["prompt_token_ids"])
            alloc = core.pool.allocate(f"bench{b}", canvas_len)
            s = args.prompt_len + args.block_length
            e = s + args.block_length
            items["full"].append(ForwardItem(canvas, alloc, 0, canvas_len, s, e))
            for m in ("prefix", "dual"):
                lo, hi = fed_range(m, False, s, e, canvas_len, llm.args.logit_shift)
                items[m].append(ForwardItem(canvas, alloc, lo, hi, s, e))
        ms = {m: 1000 * median_time(lambda: llm.runner.forward(items[m]), 5) for m in items}
        fixed.forward(items["dual"], decode_only=True)                    # builds (or captures) the shape
        ms["fixed"] = 1000 * median_time(lambda: fixed.forward(items["dual"], decode_only=True), 5)
        print(f"| {batch} | {ms['full']:.1f} | {ms['prefix']:.1f} | {ms['dual']:.1f} | {ms['full'] / ms['dual']:.1f}x "
              f"| {ms['fixed']:.1f} |")
        for b in range(batch):
            core.pool.free(f"bench{b}")
    print()
    print("config:", {k: v for k, v in dataclasses.asdict(llm.config).items() if v is not None})


if __name__ == "__main__":
    main()
