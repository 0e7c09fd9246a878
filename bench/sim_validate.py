"""Simulator validation on this CPU: bench/scheduler.py's workload through the real engine and through the
simulator (`dllm-server calibrate`'s cost model, forwards per block replayed), six configurations, three loads.

    python -m bench.sim_validate --calibration docs/results/sim_cpu.json --out docs/results/sim_validation.json
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
from pathlib import Path

from bench.harness import Table, Timer, engine_workload, parser, replay, write_json
from dllm_server.config import ServerConfig
from dllm_server.costmodel.fitted import FittedCost, fit_iterations, load_cpu_cost
from dllm_server.engine.async_engine import AsyncEngine
from dllm_server.scheduler.placement import worker_roles
from dllm_server.sim.behaviour import ReplayBehaviour, SimRequest, rows_from_outputs
from dllm_server.sim.calibrate import trace_rows
from dllm_server.sim.cluster import Simulator

# Two simulations per cell: with the calibration file (fitted earlier: the out-of-sample test the
# planner relies on) and with the same cost model fitted to the real run's own iteration reports
# (in-sample iteration times: what is left is the error of the simulated scheduling, queueing and
# messaging). The machine's load average is recorded before and after every real run.

CONFIGS = [
    ("batch-1 FCFS", dict(max_active_decodes=1, token_budget=None)),
    ("tau=1024", dict(token_budget=1024)),
    ("tau=inf", dict(token_budget=None)),
    ("colocated x2", dict(num_workers=2)),
    ("disaggregated 1P+1D", dict(placement="disaggregated", num_workers=1)),
    ("hybrid 1P+1D", dict(placement="hybrid", num_workers=1, overflow_threshold_tokens=2048)),
]


def stats(lat: list[float], n: int, span: float) -> dict:
    q = statistics.quantiles(lat, n=100)
    return {"mean_s": statistics.mean(lat), "p99_s": q[98], "req_s": n / span}


async def real_run(config: ServerConfig, reqs) -> tuple[dict, list, object, int, list]:
    engine = AsyncEngine(config)
    await engine.start()
    try:
        lat, outs, wall = await replay(engine, reqs)
        trace = engine.iteration_trace()
        info = engine.model_info
    finally:
        await engine.shutdown(0)
    return stats(lat, len(reqs), wall), outs, info, len(trace), trace_rows(trace)


def in_run_cost(calibrated: FittedCost, rows: list) -> FittedCost:
    """The calibration's cost model with its iteration fits replaced by fits to this run's reports."""
    return FittedCost(fit_iterations(rows), calibrated.message_latency_s, calibrated.idle_turn_s,
                      calibrated.kv_bytes_per_token, calibrated.link_bytes_per_s, calibrated.num_layers,
                      name="cpu-fitted-to-this-run")


def sim_run(config: ServerConfig, cost, reqs, outs, info) -> tuple[dict, int, float]:
    rows = rows_from_outputs(outs, [p for _, _, p in reqs])
    sim = Simulator(config, cost, ReplayBehaviour(rows), info, record=True)
    requests = [SimRequest(at, len(prompt["prompt_token_ids"]), p.max_tokens, None, True) for at, prompt, p in reqs]
    res = sim.run(requests)
    lat = res.latencies()
    assert len(lat) == len(reqs), f"{len(reqs) - len(lat)} simulated requests did not finish"
    return stats(lat, len(reqs), res.makespan_s), sum(len(v) for v in res.iterations.values()), res.wall_s


async def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: the embedded demo model)", seed=0)
    ap.add_argument("--calibration", required=True, help="the JSON written by `dllm-server calibrate`")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rates", default="2,4,6", help="Poisson loads, req/s")
    ap.add_argument("--only", help="comma-separated configuration names")
    ap.add_argument("--out", type=Path, default=Path("docs/results/sim_validation.json"))
    a = ap.parse_args()
    base = ServerConfig(model=a.model, dtype="float32", threads_per_worker=1, kv_cache_tokens=32768)
    rates = [float(r) for r in a.rates.split(",")]
    cells = json.loads(a.out.read_text())["cells"] if a.out.exists() and a.only else []
    table = Table(["configuration", ("load (req/s)", "g"), "real mean / p99 (s)", ("real req/s", ".2f"),
                   "sim (calibration) mean / p99 (s)", "mean / p99 / req/s err",
                   "sim (fitted to the run) mean / p99 (s)", "mean / p99 / req/s err", "iterations real / sim / sim",
                   "loadavg before -> after"])
    for name, kw in CONFIGS:
        if a.only and name not in a.only.split(","):
            continue
        cfg = base.replace(**kw)
        for rate in rates:
            reqs = engine_workload("scheduler", a.requests, rate, a.seed, a.model)
            before = os.getloadavg()
            with Timer() as t:
                real, outs, info, real_iters, rows = await real_run(cfg, reqs)
            real_wall = t.s
            after = os.getloadavg()
            roles = worker_roles(cfg.placement, cfg.num_workers, cfg.num_prefill_workers)
            calibrated = load_cpu_cost(a.calibration, num_workers=len(roles))
            cell = {"config": name, "rate": rate, "real": real, "loadavg_before": before, "loadavg_after": after,
                    "real_wall_s": real_wall, "iterations": {"real": real_iters}}
            text = []
            for key, cost in (("sim", calibrated), ("sim_in_run", in_run_cost(calibrated, rows))):
                sim, sim_iters, sim_wall = sim_run(cfg, cost, reqs, outs, info)
                err = {k: (sim[k] - real[k]) / real[k] for k in real}
                cell.update({key: sim, f"error_{key}": err, f"{key}_wall_s": sim_wall})
                cell["iterations"][key] = sim_iters
                text += [f"{sim['mean_s']:.2f} / {sim['p99_s']:.2f}",
                         f"{100 * err['mean_s']:+.0f} / {100 * err['p99_s']:+.0f} / {100 * err['req_s']:+.0f} %"]
            cell["in_run_fits"] = {k: {m: v[m] for m in ("samples", "turn_mean_abs_rel_error")}
                                   for k, v in fit_iterations(rows).items()}
            cells = [c for c in cells if (c["config"], c["rate"]) != (name, rate)] + [cell]
            it = cell["iterations"]
            table.row(name, rate, f"{real['mean_s']:.2f} / {real['p99_s']:.2f}", real["req_s"], *text,
                      f"{it['real']} / {it['sim']} / {it['sim_in_run']}", f"{before[0]:.2f} -> {after[0]:.2f}")
            write_json(a.out, {"calibration": a.calibration, "requests": a.requests, "seed": a.seed,
                               "workload": "bench.harness MIXES['scheduler'] (bench/scheduler.py's)", "cells": cells})


if __name__ == "__main__":
    asyncio.run(main())
