"""Tensor parallelism on this CPU: TP=1 with 2 threads against TP=2 with 1 thread per rank (gloo), the same
work side by side: A one forward (with the all-reduce share), B a batch served by the real engine.

    python -m bench.tp [--models demo d1024] [--batch 1 8 32] [--requests 32] [--json out.json]
"""
from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.harness import Table, Timer, parser, write_json
from dllm_server import SamplingParams
from dllm_server.checkpoint import plain_id_offset_of
from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine
from dllm_server.model.loader import load_model
from dllm_server.model.tiny import make_tiny_model
from dllm_server.model.tp import TPShard
from dllm_server.server_process import free_port
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner
from dllm_server.worker.tp import PlanSender, follow, init_groups

# "demo" is a random checkpoint of the demo model's shape with 4 heads (the embedded model's 5 allow
# TP degrees 1 and 5 only): d 320, 6 layers, MLP 864, head dim 80, a byte vocabulary. On 2 cores
# TP=2 has no more compute than TP=1 with 2 threads: it can win the per-thread efficiency of smaller
# matmuls and pays two all-reduces per layer and a plan broadcast per forward.
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
            with Timer() as t:
                runner.forward(items)
            ts.append(t.s)
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

    def timed_all_reduce(t):      # the leader's seconds in all-reduces
        with Timer() as c:
            dist.all_reduce(t, group=groups.reduce)
        comm[0] += c.s
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
        with Timer() as t:
            outs = await asyncio.gather(*[engine.run(p, s) for p, s in requests])
        wall = t.s
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
    ap = parser(__doc__)
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
            table = Table(["forward", ("TP=1, 2 threads (ms)", ".2f"), ("TP=2, 1 thread a rank (ms)", ".2f"),
                           "TP=2 / TP=1", "all-reduce share of a TP=2 forward"])
            f1, f2 = r["forward"]["tp1_2threads"], r["forward"]["tp2_1thread"]
            for case in f1:
                table.row(case, f1[case]["ms"], f2[case]["ms"], f"{f2[case]['ms'] / f1[case]['ms']:.2f}x",
                          f"{100 * f2[case]['comm_share']:.0f} %")
            f = r["forward"]
            print(f"\nweights of the sharded layers: TP=1 {f['sharded_bytes_tp1'] / 2**20:.1f} MiB, a TP=2 rank "
                  f"{f['sharded_bytes_tp2_rank0'] / 2**20:.1f} MiB "
                  f"({f['sharded_bytes_tp2_rank0'] / f['sharded_bytes_tp1']:.2f}x)")
            s1, s2 = r["served"]["tp1_2threads"], r["served"]["tp2_1thread"]
            print(f"\nserved, {a.requests} requests at once, {a.max_tokens} tokens each (fixed steps, "
                  f"{a.max_tokens // 2} forwards an answer):\n")
            table = Table(["configuration", ("wall (s)", ".2f"), ("requests/s", ".2f"), ("output tok/s", ".0f"),
                           ("mean iteration (ms)", ".1f")])
            for label, s in (("TP=1, 2 threads", s1), ("TP=2, 1 thread a rank", s2)):
                table.row(label, s["wall_s"], s["req_s"], s["tok_s"], s["mean_iteration_ms"])
            print(f"\nthroughput TP=2 / TP=1: {s2['tok_s'] / s1['tok_s']:.2f}x", flush=True)
    if a.json:
        write_json(a.json, results, indent=2)


if __name__ == "__main__":
    main()
