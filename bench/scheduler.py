"""Scheduler: one Poisson workload through the batch-1 FCFS baseline, the deficit scheduler at tau=1024 and
tau=infinity (real engine): latency, iteration token counts (plotted), time outside the forward, worker RSS.

    python -m bench.scheduler [--model DIR] [--requests 48] [--rate 4] [--plot docs/img/budget_trace.png]
"""
from __future__ import annotations

import asyncio
import dataclasses
import statistics
import tempfile
from pathlib import Path

from bench.harness import Report, engine_workload, parser, plain_ids, replay
from dllm_server import SamplingParams
from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine
from dllm_server.model.tiny import make_tiny_model


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def trace(engine) -> list:
    """Every worker iteration's LoadReport, in arrival order."""
    return [r for _, r in engine.iteration_trace()]


def worker_pages(engine, wid: int = 0) -> tuple[int, int | None]:
    """(pool pages, free pages as last reported or None before any report)."""
    w = engine.stats().workers[wid]
    return w.num_pages, w.free_pages if w.num_iterations else None


async def run_config(name: str, config: ServerConfig, reqs) -> dict:
    engine = AsyncEngine(config)
    await engine.start()
    pid = engine.stats().workers[0].pid
    idle_rss = rss_mb(pid)
    peak_rss = idle_rss

    async def sample_rss():
        nonlocal peak_rss
        while True:
            peak_rss = max(peak_rss, rss_mb(pid))
            await asyncio.sleep(0.2)

    sampler = asyncio.ensure_future(sample_rss())
    latencies, outs, wall = await replay(engine, reqs)
    tokens = [len(o.token_ids) for o in outs]
    sampler.cancel()
    reports = trace(engine)
    await engine.shutdown(0)
    loaded = [r for r in reports if r.num_active_decodes >= 16 and r.forward_s > 0]
    overhead = [1 - r.forward_s / r.iteration_s for r in loaded if r.iteration_s > 0]
    q = statistics.quantiles(latencies, n=100)
    return {"name": name, "wall_s": wall, "req_s": len(reqs) / wall, "tok_s": sum(tokens) / wall,
            "p50": statistics.median(latencies), "p99": q[98], "mean": statistics.mean(latencies),
            "trace": [r.iteration_tokens for r in reports], "deficit": [r.deficit_tokens for r in reports],
            "overhead": statistics.median(overhead) if overhead else None, "n_loaded": len(loaded),
            "idle_rss": idle_rss, "peak_rss": peak_rss}


async def profile_loaded(config: ServerConfig, num_decodes: int = 16) -> dict:
    """16 requests decoding together (fixed schedule: one token per forward keeps them all active);
    share of each iteration spent outside the model forward, measured by the worker."""
    engine = AsyncEngine(config)
    await engine.start()
    params = SamplingParams(max_tokens=128, steps=128, ignore_eos=True)
    await asyncio.gather(*[engine.run({"prompt_token_ids": [i + 1] * 96}, params) for i in range(num_decodes)])
    loaded = [r for r in trace(engine) if r.num_active_decodes >= num_decodes and r.forward_s > 0]
    await engine.shutdown(0)
    fractions = [1 - r.forward_s / r.iteration_s for r in loaded]
    return {"iterations": len(loaded), "median": statistics.median(fractions),
            "p90": statistics.quantiles(fractions, n=10)[-1],
            "iteration_ms": 1000 * statistics.median(r.iteration_s for r in loaded)}


async def measure_full_pool(config: ServerConfig) -> dict:
    """Worker RSS idle and with every KV page in use: 64 canvases of 1024 tokens fill a pool of
    65536 tokens (64 decode seats x 64 pages)."""
    config = config.replace(kv_cache_tokens=65536, max_active_decodes=64, token_budget=None)
    engine = AsyncEngine(config)
    await engine.start()
    pid = engine.stats().workers[0].pid
    idle = rss_mb(pid)
    offset = plain_ids(config.model)
    peak, min_free = idle, None

    async def sample():
        nonlocal peak, min_free
        while True:
            peak = max(peak, rss_mb(pid))
            _, free = worker_pages(engine)
            if free is not None:
                min_free = free if min_free is None else min(min_free, free)
            await asyncio.sleep(0.1)

    sampler = asyncio.ensure_future(sample())
    params = SamplingParams(max_tokens=32, steps=32, ignore_eos=True)
    await asyncio.gather(*[engine.run({"prompt_token_ids": [(i + j) % 250 + 1 + offset for j in range(992)]}, params)
                           for i in range(64)])
    sampler.cancel()
    args = engine.model_info
    pool_mb = args.num_layers * 2 * 65536 * args.num_kv_heads * args.head_dim * 4 / 2**20
    num_pages, _ = worker_pages(engine)
    await engine.shutdown(0)
    return {"idle": idle, "peak": peak, "pool_mb": pool_mb, "min_free": min_free, "pages": num_pages}


async def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: a seeded random 4-layer d=256 LLaDA)", threads=1, seed=0,
                json_out=True)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rate", type=float, default=4.0, help="Poisson arrivals per second")
    ap.add_argument("--plot", default="docs/img/budget_trace.png")
    args = ap.parse_args()
    path = args.model or str(make_tiny_model(tempfile.mkdtemp(), arch="llada", hidden=256, layers=4, heads=4,
                                             mlp=704, seed=0))
    base = ServerConfig(model=path, dtype="float32", threads_per_worker=args.threads, kv_cache_tokens=32768)
    configs = [
        ("batch-1 FCFS baseline", base.replace(max_active_decodes=1, token_budget=None)),
        ("deficit tau=1024", base.replace(token_budget=1024)),
        ("tau=infinity (prefill priority)", base.replace(token_budget=None)),
    ]
    reqs = engine_workload("scheduler", args.requests, args.rate, args.seed, path)
    print(f"workload: {args.requests} requests, Poisson {args.rate}/s, prompts 32/96/224, answers 32/64/96, "
          f"block 32, threshold 0.9, 1 colocated worker, {args.threads} thread(s)")
    print("base config:", {k: v for k, v in dataclasses.asdict(base).items() if v is not None})
    results = [await run_config(name, cfg, reqs) for name, cfg in configs]
    print()
    report = Report(args.json)
    table = report.table(["configuration", ("req/s", ".2f"), ("output tok/s", ".1f"), ("mean latency (s)", ".2f"),
                          ("p50 (s)", ".2f"), ("p99 (s)", ".2f")])
    for r in results:
        table.row(r["name"], r["req_s"], r["tok_s"], r["mean"], r["p50"], r["p99"])
    print()
    table = report.table(["configuration", "iterations", "max tokens / iteration", "iterations at >= 16 decodes",
                          "time outside forward (median)", "worker RSS idle / peak (MB)"])
    for r in results:
        ov = "n/a" if r["overhead"] is None else f"{100 * r['overhead']:.1f} %"
        table.row(r["name"], len(r["trace"]), max(r["trace"]), r["n_loaded"], ov,
                  f"{r['idle_rss']:.0f} / {r['peak_rss']:.0f}")
    prof = await profile_loaded(configs[1][1])
    print(f"\nloaded iteration profile (16 active decodes, tau=1024, {prof['iterations']} iterations): "
          f"median iteration {prof['iteration_ms']:.1f} ms, time outside the model forward "
          f"median {100 * prof['median']:.1f} %, p90 {100 * prof['p90']:.1f} %")
    mem = await measure_full_pool(base)
    print(f"worker RSS: idle {mem['idle']:.0f} MB, with the KV pool full ({mem['pages'] - mem['min_free']} of "
          f"{mem['pages']} pages in use, pool {mem['pool_mb']:.0f} MB fp32) {mem['peak']:.0f} MB")
    report.add(loaded_profile=prof, worker_memory=mem)
    report.save()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for r, ax in zip(results[1:], axes):
        ax.plot(r["trace"], lw=0.7, label="tokens fed per iteration")
        ax.plot(r["deficit"], lw=0.7, label="deficit carried")
        ax.axhline(1024, color="red", ls="--", lw=0.7, label="tau = 1024")
        ax.set_title(r["name"])
        ax.set_ylabel("tokens")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("worker iteration")
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    asyncio.run(main())
