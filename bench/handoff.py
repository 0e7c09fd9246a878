"""KV handoff: one disaggregated workload (1 prefill + 1 decode worker) with the KV streamed layer by layer
(kv_transfer=layerwise) and sent after the prefill step, alternating rounds: stall, bytes, latency.

    python -m bench.handoff [--model DIR] [--requests 32] [--rate 3] [--rounds 2] [--json out.json]
"""
from __future__ import annotations

import asyncio
import statistics

from bench.harness import Report, engine_workload, parser, replay
from dllm_server.checkpoint import embedded_model_path
from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine

MODES = ("after_prefill", "layerwise")


async def run(config: ServerConfig, reqs) -> dict:
    engine = AsyncEngine(config)
    await engine.start()
    latencies, outs, wall = await replay(engine, reqs)
    c = engine.stats().counters
    await engine.shutdown(0)
    # a handoff's stall: the prefill step's end to the block's first decode step on the decode worker
    return {"handoffs": c.kv_handoffs, "stall_ms": 1e3 * c.kv_handoff_stall_seconds / max(1, c.kv_handoffs),
            "mb": c.kv_transfer_bytes / 2**20, "failed": c.kv_transfers_failed,
            "tok_s": sum(len(o.token_ids) for o in outs) / wall,
            "mean": statistics.mean(latencies), "p50": statistics.median(latencies),
            "p99": statistics.quantiles(latencies, n=100)[98]}


async def main_async(a) -> None:
    base = ServerConfig(model=a.model, placement="disaggregated", num_workers=1, num_prefill_workers=1,
                        threads_per_worker=1)
    reqs = engine_workload("handoff", a.requests, a.rate, a.seed, a.model)
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(a.rounds):
        for mode in MODES:
            res = await run(base.replace(kv_transfer=mode), reqs)
            results[mode].append(res)
            print(f"round {r + 1} {mode}: {res}", flush=True)
    print(f"\n{a.requests} requests, Poisson {a.rate}/s, prompts 96/224/480, answers 64/96, block 32; "
          f"median over {a.rounds} rounds\n")
    report = Report(a.json)
    table = report.table(["kv_transfer", ("handoffs", ".0f"), ("stall per handoff (ms)", ".1f"),
                          ("KV moved (MiB)", ".1f"), ("failed", ".0f"), ("output tok/s", ".1f"),
                          ("mean latency (s)", ".2f"), ("p50 (s)", ".2f"), ("p99 (s)", ".2f")])
    for mode in MODES:
        med = {k: statistics.median(x[k] for x in results[mode]) for k in results[mode][0]}
        table.row(mode, *(med[k] for k in ("handoffs", "stall_ms", "mb", "failed", "tok_s", "mean", "p50", "p99")))
    report.save()


def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: the embedded demo model)", seed=0, json_out=True)
    ap.set_defaults(model=str(embedded_model_path()))
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
