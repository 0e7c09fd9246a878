"""KV handoff benchmark: the same disaggregated workload with the KV streamed layer by layer
during the prefill forward (`kv_transfer=layerwise`) and sent after the prefill step
(`after_prefill`), on the real multi-process engine (one prefill worker, one decode worker, gloo
on the CPU). Reports the handoff stall (the prefill step's end to the block's first decode step
on the decode worker, mean per handoff), KV bytes moved, throughput and latency. The runs
alternate (A, B, A, B, ...) so drift on a shared machine hits both alike.

    python bench/handoff.py [--model DIR] [--requests 32] [--rate 3] [--rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics

from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine
from dllm_server.checkpoint import embedded_model_path

from common import plain_id_offset, poisson_workload, replay

MODES = ("after_prefill", "layerwise")


def workload(n: int, rate: float, seed: int, offset: int = 0):
    return poisson_workload(n, rate, seed, prompt_lens=(96, 224, 480), answer_lens=(64, 96), offset=offset)


async def run(config: ServerConfig, reqs) -> dict:
    engine = AsyncEngine(config)
    await engine.start()
    latencies, outs, wall = await replay(engine, reqs)
    c = engine.stats().counters
    await engine.shutdown(0)
    return {"handoffs": c.kv_handoffs, "stall_ms": 1e3 * c.kv_handoff_stall_seconds / max(1, c.kv_handoffs),
            "mb": c.kv_transfer_bytes / 2**20, "failed": c.kv_transfers_failed,
            "tok_s": sum(len(o.token_ids) for o in outs) / wall,
            "mean": statistics.mean(latencies), "p50": statistics.median(latencies),
            "p99": statistics.quantiles(latencies, n=100)[98]}


async def main_async(a) -> None:
    base = ServerConfig(model=a.model, placement="disaggregated", num_workers=1, num_prefill_workers=1,
                        threads_per_worker=1)
    reqs = workload(a.requests, a.rate, a.seed, plain_id_offset(a.model))
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(a.rounds):
        for mode in MODES:
            res = await run(base.replace(kv_transfer=mode), reqs)
            results[mode].append(res)
            print(f"round {r + 1} {mode}: {res}", flush=True)
    print(f"\n{a.requests} requests, Poisson {a.rate}/s, prompts 96/224/480, answers 64/96, block 32; "
          f"median over {a.rounds} rounds\n")
    print("| kv_transfer | handoffs | stall per handoff (ms) | KV moved (MiB) | failed | output tok/s "
          "| mean latency (s) | p50 (s) | p99 (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in MODES:
        med = {k: statistics.median(x[k] for x in results[mode]) for k in results[mode][0]}
        print(f"| {mode} | {med['handoffs']:.0f} | {med['stall_ms']:.1f} | {med['mb']:.1f} | {med['failed']:.0f} "
              f"| {med['tok_s']:.1f} | {med['mean']:.2f} | {med['p50']:.2f} | {med['p99']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(embedded_model_path()))
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
