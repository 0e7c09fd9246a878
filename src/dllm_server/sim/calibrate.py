"""Calibration of the CPU cost model: run the real engine briefly on this machine under three token budgets,
fit its iteration reports, and measure message latency and gloo link bandwidth.

    dllm-server calibrate --out sim_cpu.json [--model DIR] [--workers 1,2]
"""
from __future__ import annotations

import asyncio
import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from loadgen.arrivals import arrival_offsets
from loadgen.run import open_loop
from loadgen.workload import random_ids

from ..config import ServerConfig
from ..decoding.params import SamplingParams
from ..checkpoint import plain_id_offset_of
from ..costmodel.fitted import FittedCost, fit_iterations


def _workload(n: int, rate: float, seed: int, prompts, answers, offset: int = 0) -> list:
    rng = np.random.default_rng(seed)
    at = arrival_offsets("poisson", rate, n, rng)
    return [(float(a), random_ids(int(rng.choice(prompts)), rng, 250 + offset, 1 + offset),
             SamplingParams(max_tokens=int(rng.choice(answers)), ignore_eos=True, seed=i)) for i, a in enumerate(at)]


async def _replay(engine, reqs) -> None:
    async def one(i):
        _, ids, params = reqs[i]
        return await engine.run({"prompt_token_ids": ids}, params)
    await open_loop([r[0] for r in reqs], one)


def trace_rows(trace) -> list[tuple]:
    return [(r.iteration_tokens - r.prefill_tokens, r.decode_keys, r.prefill_tokens, r.prefill_sq, r.iteration_s,
             r.forward_s) for _, r in trace if r.forward_s > 0]


async def _measure(config: ServerConfig, seed: int) -> tuple[list[tuple], list[tuple[float, list]], object]:
    """(iteration rows under load, [(latency, its iterations' reports)] of requests sent alone, ModelInfo)."""
    from ..engine.async_engine import AsyncEngine
    rows: list[tuple] = []
    alone: list[tuple[float, list]] = []
    info = None
    rate = 2.0 * config.num_workers
    for k, tau in enumerate((1024, None, 256)):
        engine = AsyncEngine(config.replace(token_budget=tau))
        await engine.start()
        info = engine.model_info
        offset = plain_id_offset_of(config.model)
        try:
            await _replay(engine, _workload(24 * config.num_workers, rate, seed + k, (32, 96, 224, 480),
                                            (32, 64, 96, 160), offset))
            if k == 0:
                for i, (_, ids, params) in enumerate(_workload(6, 1.0, seed + 10, (32, 224, 480), (32, 96), offset)):
                    await asyncio.sleep(0.1)
                    t0 = time.monotonic()
                    await engine.run({"prompt_token_ids": ids}, params)
                    t1 = time.monotonic()
                    alone.append((t1 - t0, [r for at, r in engine.iteration_trace() if t0 < at <= t1]))
            rows += trace_rows(engine.iteration_trace())
        finally:
            await engine.shutdown(0)
    return rows, alone, info


def _latency(cost: FittedCost, alone: list[tuple[float, list]]) -> float:
    """One-way front <-> worker latency: a request alone takes in + its turns + out."""
    from ..costmodel.iteration import IterationStats
    extra = []
    for latency, reports in alone:
        turns = sum(cost.turn_s(IterationStats(r.prefill_tokens, r.iteration_tokens - r.prefill_tokens,
                                               r.decode_keys, r.prefill_sq, r.num_prefills,
                                               r.num_active_decodes)) for r in reports if r.iteration_tokens)
        extra.append((latency - turns) / 2)
    return max(0.0, statistics.median(extra)) if extra else 5e-4


def _gloo_rank(rank: int, port: int, sizes: list[int], out) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    times = []
    for n in sizes:
        buf = torch.zeros(n // 4, dtype=torch.float32)
        for rep in range(3):
            dist.barrier()
            t = time.perf_counter()
            dist.send(buf, 1) if rank == 0 else dist.recv(buf, 0)
            if rank == 1:
                times.append((n, time.perf_counter() - t))
    if rank == 1:
        out.put(times)
    dist.destroy_process_group()


def link_bandwidth(sizes=(1 << 20, 4 << 20, 16 << 20)) -> float:
    """Bytes per second of a gloo send on loopback between two processes (the CPU handoff path)."""
    import torch.multiprocessing as mp
    from ..server_process import free_port
    ctx = mp.get_context("spawn")
    q, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_gloo_rank, args=(r, port, list(sizes), q)) for r in (0, 1)]
    for p in procs:
        p.start()
    times = q.get(timeout=120)
    for p in procs:
        p.join(30)
    n = np.asarray([t[0] for t in times], dtype=float)
    s = np.asarray([t[1] for t in times])
    return float(n.sum() / s.sum())


def calibrate(model: str | None, workers=(1, 2), seed: int = 0) -> dict:
    base = ServerConfig(model=model, dtype="float32", threads_per_worker=1, kv_cache_tokens=32768)
    load_before = os.getloadavg()
    by_workers, latencies = {}, []
    info = None
    for n in workers:
        rows, alone, info = asyncio.run(_measure(base.replace(num_workers=n), seed))
        fits = fit_iterations(rows)
        by_workers[str(n)] = {"fits": fits, "samples": len(rows)}
        latencies.append(_latency(FittedCost(fits, 0.0, 1e-4, 0, 1.0, 1), alone))
    kv_per_token = 2 * info.num_layers * info.num_kv_heads * info.head_dim * 4   # fp32 KV on the CPU
    num_layers = info.num_layers
    bw = link_bandwidth()
    return {"kind": "cpu-fitted", "by_workers": by_workers, "message_latency_s": statistics.median(latencies),
            "idle_turn_s": 1e-4, "kv_bytes_per_token": kv_per_token, "link_bytes_per_s": bw, "num_layers": num_layers,
            "meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "host": platform.node(), "cpu_count": os.cpu_count(), "model": model or "embedded demo model",
                     "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                     "message_latency_by_workers": dict(zip(map(str, workers), latencies)),
                     "idle_turn_s_source": "assumption (a turn that only handles messages)",
                     "config": {"dtype": "float32", "threads_per_worker": 1, "kv_cache_tokens": 32768}}}


def write_calibration(out: str | Path, model: str | None, workers=(1, 2), seed: int = 0) -> dict:
    import json
    data = calibrate(model, workers, seed)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(data, indent=1))
    return data
