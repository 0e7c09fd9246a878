"""HTTP end-to-end throughput at saturation against the same workload through the offline API,
measured in one run: the cost of the server (HTTP, JSON, queues, a separate worker process).
Then the same at batch 1 (`--sequential N` requests one after another, short blocks so block
boundaries are frequent): the latency the served path adds per request, per block and per step.

    python bench/http_vs_offline.py [--model DIR] [--requests 64] [--max-tokens 64] [--threads 2]
                                    [--sequential 8] [--sequential-block 8]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch

from dllm_server import LLM, SamplingParams
from dllm_server.server_process import serve
from dllm_server.model.tiny import make_tiny_model
from common import plain_id_offset


def workload(n: int, max_tokens: int, seed: int = 0, offset: int = 0):
    rng = random.Random(seed)
    return [[rng.randrange(1, 250) + offset for _ in range(rng.choice([32, 96, 160]))] for _ in range(n)]


async def run_http(url: str, prompts, max_tokens: int) -> tuple[float, int]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=len(prompts))) as c:
        t = time.perf_counter()
        rs = await asyncio.gather(*[c.post(url + "/v1/completions", json={
            "prompt": p, "max_tokens": max_tokens, "ignore_eos": True, "seed": i}) for i, p in enumerate(prompts)])
        wall = time.perf_counter() - t
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200][:2]
    return wall, sum(r.json()["usage"]["completion_tokens"] for r in rs)


def sequential(url: str, llm, prompts, max_tokens: int, block: int) -> dict:
    """Latency of one request at a time, offline and over HTTP, alternating per request; the extra
    latency of the served path is the median of the paired differences."""
    off, http, forwards = [], [], []
    with httpx.Client(timeout=600, trust_env=False) as c:
        for i, p in enumerate(prompts):
            t = time.perf_counter()
            o = llm.generate({"prompt_token_ids": p}, SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=i,
                                                                      block_length=block))[0]
            off.append(time.perf_counter() - t)
            t = time.perf_counter()
            r = c.post(url + "/v1/completions", json={"prompt": p, "max_tokens": max_tokens, "ignore_eos": True,
                                                      "seed": i, "block_length": block, "return_token_ids": True})
            http.append(time.perf_counter() - t)
            assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == o.token_ids, r.text[:300]
            forwards.append(o.stats.num_forwards)
    n_blocks = -(-max_tokens // block)
    extra_ms = 1e3 * statistics.median(h - o for h, o in zip(http, off))   # paired: drift cancels
    return {"offline_ms": 1e3 * statistics.mean(off), "http_ms": 1e3 * statistics.mean(http), "extra_ms": extra_ms,
            "extra_ms_per_block": extra_ms / n_blocks, "extra_ms_per_step": extra_ms / statistics.mean(forwards),
            "blocks": n_blocks, "forwards": statistics.mean(forwards)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="torch threads: offline process and the one worker")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sequential", type=int, default=24, help="batch-1 requests (0: skip that phase)")
    ap.add_argument("--sequential-block", type=int, default=8, help="block length of the batch-1 requests")
    args = ap.parse_args()
    path = args.model or str(make_tiny_model(tempfile.mkdtemp(), arch="llada", hidden=256, layers=4, heads=4,
                                             mlp=704, seed=0))
    prompts = workload(args.requests, args.max_tokens, offset=plain_id_offset(path))
    flags = ["--dtype", "float32", "--threads-per-worker", str(args.threads)]
    server = serve(path, *flags, log_path=Path(tempfile.mkdtemp()) / "server.log")
    url = server.url
    try:
        torch.set_num_threads(args.threads)
        llm = LLM(path, dtype="float32")
        params = [SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, seed=i) for i in range(len(prompts))]
        asyncio.run(run_http(url, prompts[:4], args.max_tokens))             # warm-ups
        llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], params[:4])
        rows = []
        for r in range(args.rounds):   # alternate so drift on a shared machine hits both alike
            t = time.perf_counter()
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
            off_wall = time.perf_counter() - t
            off_tokens = sum(len(o.token_ids) for o in outs)
            http_wall, http_tokens = asyncio.run(run_http(url, prompts, args.max_tokens))
            rows.append((off_tokens / off_wall, http_tokens / http_wall))
        seq = sequential(url, llm, prompts[: args.sequential], args.max_tokens, args.sequential_block) \
            if args.sequential else None
    finally:
        server.stop(timeout=60)
    print(f"model={path} requests={args.requests} max_tokens={args.max_tokens} threads={args.threads} "
          f"cpus={os.cpu_count()} (all requests sent at once; ignore_eos)")
    print("| round | offline output tok/s | HTTP output tok/s | HTTP / offline |")
    print("|---|---|---|---|")
    for i, (off, http) in enumerate(rows):
        print(f"| {i + 1} | {off:.1f} | {http:.1f} | {http / off:.2f} |")
    off = sum(r[0] for r in rows) / len(rows)
    http = sum(r[1] for r in rows) / len(rows)
    print(f"| mean | {off:.1f} | {http:.1f} | {http / off:.2f} |")
    result = {"offline_tok_s": round(off, 1), "http_tok_s": round(http, 1), "ratio": round(http / off, 3)}
    if seq:
        print(f"\nbatch 1: {args.sequential} requests one at a time, {args.max_tokens} tokens in blocks of "
              f"{args.sequential_block} ({seq['blocks']} blocks, {seq['forwards']:.1f} forwards each), token-identical")
        print("| path | mean latency (ms) |\n|---|---|")
        print(f"| offline | {seq['offline_ms']:.1f} |\n| HTTP | {seq['http_ms']:.1f} |")
        print(f"served path adds (median of paired differences) {seq['extra_ms']:.1f} ms per request = {seq['extra_ms_per_block']:.2f} ms per block "
              f"= {seq['extra_ms_per_step']:.2f} ms per step")
        result.update({k: round(seq[k], 3) for k in ("offline_ms", "http_ms", "extra_ms_per_block", "extra_ms_per_step")})
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
