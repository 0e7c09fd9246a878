"""The server's cost: HTTP end-to-end throughput at saturation against the same workload offline, then
at batch 1 (`--sequential N` requests one at a time) the latency the served path adds per block and step.

    python -m bench.http_vs_offline [--model DIR] [--requests 64] [--max-tokens 64] [--threads 2] [--sequential 8]
"""
from __future__ import annotations

import asyncio
import os
import statistics
import tempfile

import httpx
import torch

from bench.harness import Report, Timer, id_prompts, parser, plain_ids, result, server
from dllm_server import LLM, SamplingParams
from dllm_server.model.tiny import make_tiny_model

PROMPT_LENS = (32, 96, 160)


def prompts_for(model: str, n: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts of token ids, 32, 96 or 160 long, clear of the model's special tokens."""
    return id_prompts(n, PROMPT_LENS, seed, plain_ids(model))


async def run_http(url: str, prompts, max_tokens: int) -> tuple[float, int]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=len(prompts))) as c:
        with Timer() as t:
            rs = await asyncio.gather(*[c.post(url + "/v1/completions", json={
                "prompt": p, "max_tokens": max_tokens, "ignore_eos": True, "seed": i}) for i, p in enumerate(prompts)])
        wall = t.s
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200][:2]
    return wall, sum(r.json()["usage"]["completion_tokens"] for r in rs)


def sequential(url: str, llm, prompts, max_tokens: int, block: int) -> dict:
    """Latency of one request at a time, offline and over HTTP, alternating per request; the extra
    latency of the served path is the median of the paired differences."""
    off, http, forwards = [], [], []
    with httpx.Client(timeout=600, trust_env=False) as c:
        for i, p in enumerate(prompts):
            with Timer() as t:
                o = llm.generate({"prompt_token_ids": p}, SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                                          seed=i, block_length=block))[0]
            off.append(t.s)
            with Timer() as t:
                r = c.post(url + "/v1/completions", json={"prompt": p, "max_tokens": max_tokens, "ignore_eos": True,
                                                          "seed": i, "block_length": block, "return_token_ids": True})
            http.append(t.s)
            assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == o.token_ids, r.text[:300]
            forwards.append(o.stats.num_forwards)
    n_blocks = -(-max_tokens // block)
    extra_ms = 1e3 * statistics.median(h - o for h, o in zip(http, off))   # paired: drift cancels
    return {"offline_ms": 1e3 * statistics.mean(off), "http_ms": 1e3 * statistics.mean(http), "extra_ms": extra_ms,
            "extra_ms_per_block": extra_ms / n_blocks, "extra_ms_per_step": extra_ms / statistics.mean(forwards),
            "blocks": n_blocks, "forwards": statistics.mean(forwards)}


def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: a seeded random 4-layer d=256 LLaDA)", json_out=True)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="torch threads: offline process and the one worker")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sequential", type=int, default=24, help="batch-1 requests (0: skip that phase)")
    ap.add_argument("--sequential-block", type=int, default=8, help="block length of the batch-1 requests")
    args = ap.parse_args()
    path = args.model or str(make_tiny_model(tempfile.mkdtemp(), arch="llada", hidden=256, layers=4, heads=4,
                                             mlp=704, seed=0))
    prompts = prompts_for(path, args.requests)
    with server(path, "--dtype", "float32", "--threads-per-worker", str(args.threads)) as s:
        torch.set_num_threads(args.threads)
        llm = LLM(path, dtype="float32")
        params = [SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, seed=i) for i in range(len(prompts))]
        asyncio.run(run_http(s.url, prompts[:4], args.max_tokens))             # warm-ups
        llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], params[:4])
        rows = []
        for r in range(args.rounds):   # alternate so drift on a shared machine hits both alike
            with Timer() as t:
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
            off_tokens = sum(len(o.token_ids) for o in outs)
            http_wall, http_tokens = asyncio.run(run_http(s.url, prompts, args.max_tokens))
            rows.append((off_tokens / t.s, http_tokens / http_wall))
        seq = sequential(s.url, llm, prompts[: args.sequential], args.max_tokens, args.sequential_block) \
            if args.sequential else None
    print(f"model={path} requests={args.requests} max_tokens={args.max_tokens} threads={args.threads} "
          f"cpus={os.cpu_count()} (all requests sent at once; ignore_eos)")
    report = Report(args.json)
    table = report.table(["round", ("offline output tok/s", ".1f"), ("HTTP output tok/s", ".1f"),
                          ("HTTP / offline", ".2f")])
    for i, (off, http) in enumerate(rows):
        table.row(i + 1, off, http, http / off)
    off = sum(r[0] for r in rows) / len(rows)
    http = sum(r[1] for r in rows) / len(rows)
    table.row("mean", off, http, http / off)
    figures = {"offline_tok_s": round(off, 1), "http_tok_s": round(http, 1), "ratio": round(http / off, 3)}
    if seq:
        print(f"\nbatch 1: {args.sequential} requests one at a time, {args.max_tokens} tokens in blocks of "
              f"{args.sequential_block} ({seq['blocks']} blocks, {seq['forwards']:.1f} forwards each), token-identical")
        table = report.table(["path", ("mean latency (ms)", ".1f")])
        table.row("offline", seq["offline_ms"])
        table.row("HTTP", seq["http_ms"])
        print(f"served path adds (median of paired differences) {seq['extra_ms']:.1f} ms per request = "
              f"{seq['extra_ms_per_block']:.2f} ms per block = {seq['extra_ms_per_step']:.2f} ms per step")
        figures.update({k: round(seq[k], 3) for k in ("offline_ms", "http_ms", "extra_ms_per_block",
                                                      "extra_ms_per_step")})
    report.add(**figures)
    report.save()
    result(figures)


if __name__ == "__main__":
    main()
