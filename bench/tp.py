"""Tensor parallelism on this CPU: TP=1 with 2 torch threads against TP=2 with 1 thread per rank
(two processes over gloo), the same work, side by side in one run. Two parts per model:

  A. forward: one packed dual-cache block step of B requests (B x 32 rows) and one prefill, the
     median time per forward, and the share of a TP=2 forward spent in its all-reduces (timed
     around each gloo all_reduce on the leader);
  B. served: the same batch of requests through the engine with real worker processes
     (AsyncEngine): wall time, requests/s, output tokens/s and the mean iteration time the
     workers reported.

    python bench/tp.py                      # demo-shaped and d=1024 random checkpoints
    python bench/tp.py --models demo --batch 1 8 --requests 16

The embedded demo model has 5 attention heads, which allow tensor-parallel degrees 1 and 5 only,
so "demo" here is a random checkpoint of its shape with 4 heads (d 320, 6 layers, MLP 864, head
dim 80; byte-level vocabulary of 262 instead of 4096, so its replicated LM head is smaller).

On 2 cores a TP=2 instance has no more compute than TP=1 with 2 threads: what it can win is the
per-thread efficiency of smaller matmuls; what it pays is two all-reduces per layer and a plan
broadcast per forward. Reported as measured, no target.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_server import SamplingParams  # noqa: E402
from dllm_server.checkpoint import plain_id_offset_of  # noqa: E402
from dllm_server.config import ServerConfig  # noqa: E402
from dllm_server.engine.async_engine import AsyncEngine  # noqa: E402
from dllm_server.server_process import free_port  # noqa: E402
from dllm_server.model.loader import load_model  # noqa: E402
from dllm_server.model.tiny import make_tiny_model  # noqa: E402
from dllm_server.model.tp import TPShard  # noqa: E402
from dllm_server.worker.kv_pool import KVPool  # noqa: E402
from dllm_server.worker.runner import ForwardItem, ModelRunner  # noqa: E402
from dllm_server.worker.tp import PlanSender, follow, init_groups  # noqa: E402

BLOCK, PROMPT, PREFILL = 32, 96, 224


def forward_cases(runner: ModelRunner, pool: KVPool, args, batches: list[int], first_id: int) -> dict:
    """{name: items}: B dual-cache block steps over canvases whose KV a full forward filled, and a
    prefill of PREFILL positions."""
    cases, canvas_len = {}, PROMPT + 2 * BLOCK
    for b in batches:
        items = []
        for i in range(b):
            c = torch.full((canvas_len,), args.mask_id, dtype=torch.int64)
            c[:PROMPT] = torch.arange(PROMPT) % 200 + first_id + i
            a = pool.allocate(f"b{b}-{i}", canvas_len)
            runner.forward([ForwardItem(c, a, 0, canvas_len, PROMPT, PROMPT + BLOCK)])
            items.append(ForwardItem(c, a, PROMPT, PROMPT + BLOCK, PROMPT, PROMPT + BLOCK))
        cases[f"block step, batch {b}"] = items
    c = torch.full((PREFILL,), args.mask_id, dtype=torch.int64)
    c[: PREFILL // 2] = torch.arange(PREFILL // 2) % 200 + first_id
    cases[f"prefill, canvas {PREFILL}"] = [ForwardItem(c, pool.allocate("prefill", PREFILL), 0, PREFILL,
                                                       PREFILL // 2, PREFILL // 2 + BLOCK)]
    return cases


def time_cases(runner, cases: dict, reps: int, comm: list | None = None) -> dict:
    out = {}
    for name, items in cases.items():
        for _ in range(3):
            runner.forward(items)
        ts, cs = [], []
        for _ in range(reps):
            c0 = comm[0] if comm else 0.0
            t = time.perf_counter()
            runner.forward(items)
            ts.append(time.perf_counter() - t)
            cs.append((comm[0] - c0) if comm else 0.0)
        out[name] = {"ms": 1e3 * statistics.median(ts), "comm_share": statistics.median(c / t for c, t in zip(cs, ts))}
    return out


def sharded_bytes(model) -> int:
    """Weight bytes of the layers tensor parallelism splits (attention and MLP projections)."""
    from dllm_server.model.layers import Projections
    return sum(p.numel() * p.element_size() for m in model.modules() if isinstance(m, Projections)
               for p in m.parameters())


def build(path: str, shard: TPShard | None):
    model, args, dtype = load_model(path, "float32", tp=shard)
    pool = KVPool(args.num_layers, 2048, 16, args.local_kv_heads, args.head_dim, dtype)
    return ModelRunner(model, args, pool, torch.device("cpu")), pool, args


def rank_main(rank: int, port: int, path: str, batches: list[int], reps: int, first_id: int, results) -> None:
    torch.set_num_threads(1)
    groups = init_groups(rank, 2, "127.0.0.1", port, torch.device("cpu"))
    comm = [0.0]

    def timed_all_reduce(t):
        t0 = time.perf_counter()
        dist.all_reduce(t, group=groups.reduce)
        comm[0] += time.perf_counter() - t0
    runner, pool, args = build(path, TPShard(rank, 2, timed_all_reduce))
    if rank == 0:
        sender = runner.plan_sink = PlanSender(groups)
        timed = time_cases(runner, forward_cases(runner, pool, args, batches, first_id), reps, comm)
        results.put({"cases": timed, "sharded_bytes": sharded_bytes(runner.model)})
        sender.stop()
    else:
        follow(runner, groups, args.mask_id, pool.page_size)
    dist.destroy_process_group()


def part_a(path: str, batches: list[int], reps: int) -> dict:
    first = 1 + plain_id_offset_of(path)
    torch.set_num_threads(2)
    runner, pool, args = build(path, None)
    tp1 = time_cases(runner, forward_cases(runner, pool, args, batches, first), reps)
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, path, batches, reps, first, results)) for r in range(2)]
    for p in procs:
        p.start()
    tp2 = results.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    return {"tp1_2threads": tp1, "tp2_1thread": tp2["cases"], "sharded_bytes_tp1": sharded_bytes(runner.model),
            "sharded_bytes_tp2_rank0": tp2["sharded_bytes"]}


async def _serve(config: ServerConfig, requests: list) -> dict:
    engine = AsyncEngine(config)
    await engine.start(timeout_s=300)
    try:
        await asyncio.gather(*[engine.run(p, s) for p, s in requests[:2]])        # warm-up
        n0 = len(engine.iteration_trace())
        t = time.perf_counter()
        outs = await asyncio.gather(*[engine.run(p, s) for p, s in requests])
        wall = time.perf_counter() - t
        iters = [r.iteration_s for _, r in engine.iteration_trace()[n0:] if r.iteration_tokens]
    finally:
        await engine.shutdown(0)
    tokens = sum(len(o.token_ids) for o in outs)
    return {"wall_s": wall, "req_s": len(requests) / wall, "tok_s": tokens / wall,
            "mean_iteration_ms": 1e3 * statistics.mean(iters) if iters else None, "iterations": len(iters)}


def part_b(path: str, n: int, max_tokens: int) -> dict:
    first = 1 + plain_id_offset_of(path)
    reqs = [({"prompt_token_ids": [first + (i * 7 + k) % 200 for k in range(40 + 4 * (i % 8))]},
             SamplingParams(max_tokens=max_tokens, ignore_eos=True, steps=max_tokens // 2, seed=i)) for i in range(n)]
    base = ServerConfig(model=path, dtype="float32", block_length=BLOCK)
    return {"tp1_2threads": asyncio.run(_serve(base.replace(threads_per_worker=2), reqs)),
            "tp2_1thread": asyncio.run(_serve(base.replace(threads_per_worker=1, tensor_parallel_size=2), reqs))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["demo", "d1024"], help="demo and/or d1024 (random)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        shapes = {"demo": dict(hidden=320, layers=6, heads=4, mlp=864),
                  "d1024": dict(hidden=1024, layers=8, heads=16, mlp=2816)}
        paths = {m: str(make_tiny_model(Path(tmp) / m, seed=5, **shapes[m])) for m in a.models}
        for name in a.models:
            path = paths[name]
            r = {"forward": part_a(path, a.batch, a.reps), "served": part_b(path, a.requests, a.max_tokens)}
            results[name] = r
            print(f"\n## {name}: random weights, {shapes[name]}\n")
            print("| forward | TP=1, 2 threads (ms) | TP=2, 1 thread a rank (ms) | TP=2 / TP=1 | all-reduce share of a TP=2 "
                  "forward |\n|---|---|---|---|---|")
            f1, f2 = r["forward"]["tp1_2threads"], r["forward"]["tp2_1thread"]
            for case in f1:
                print(f"| {case} | {f1[case]['ms']:.2f} | {f2[case]['ms']:.2f} | {f2[case]['ms'] / f1[case]['ms']:.2f}x "
                      f"| {100 * f2[case]['comm_share']:.0f} % |")
            f = r["forward"]
            print(f"\nweights of the sharded layers: TP=1 {f['sharded_bytes_tp1'] / 2**20:.1f} MiB, a TP=2 rank "
                  f"{f['sharded_bytes_tp2_rank0'] / 2**20:.1f} MiB "
                  f"({f['sharded_bytes_tp2_rank0'] / f['sharded_bytes_tp1']:.2f}x)")
            s1, s2 = r["served"]["tp1_2threads"], r["served"]["tp2_1thread"]
            print(f"\nserved, {a.requests} requests at once, {a.max_tokens} tokens each (fixed steps, "
                  f"{a.max_tokens // 2} forwards an answer):\n")
            print("| configuration | wall (s) | requests/s | output tok/s | mean iteration (ms) |\n|---|---|---|---|---|")
            for label, s in (("TP=1, 2 threads", s1), ("TP=2, 1 thread a rank", s2)):
                print(f"| {label} | {s['wall_s']:.2f} | {s['req_s']:.2f} | {s['tok_s']:.0f} | "
                      f"{s['mean_iteration_ms']:.1f} |")
            print(f"\nthroughput TP=2 / TP=1: {s2['tok_s'] / s1['tok_s']:.2f}x", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
