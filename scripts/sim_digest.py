"""A digest of the simulator's decisions on fixed seeds (SIMULATED): every request's ending,
latency, forwards and block thresholds, the scheduler's counters and every regroup and planner
decision, hashed. Two trees that schedule alike print the same digests (issue 39's check that a
refactoring changed no decision).

    .venv/bin/python scripts/sim_digest.py
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import torch

from dllm_server.config import ServerConfig
from loadgen.burst import burst_rows, scaled_phases, write_jsonl

try:     # the layout after issue 39's redesign
    from dllm_server.costmodel.gpu import MODELS, gpu_cost
except ImportError:     # the layout before it (63b3c91's tree)
    from dllm_server.sim.gpu_cost import MODELS, gpu_cost
try:
    from dllm_server.sim.regroup import reconfigurer
except ImportError:
    from dllm_server.sim.regroup import Reconfigurer

    def reconfigurer(sim, cost_for, restart_s, heads):
        return Reconfigurer(sim, cost_for, restart_s, heads)
from dllm_server.sim.behaviour import POSITIONS_PER_FORWARD, ParametricBehaviour, positions_per_forward
from dllm_server.sim.cluster import Simulator
from dllm_server.sim.instances import unloaded_latency_s, with_slos
from dllm_server.sim.regroup import layout_simulator
from dllm_server.sim.workload import trace_workload

MODEL, BLOCK = "llada-8b", 32


def requests(scales, phase_s: float, slo_k: float, seed: int):
    rows = burst_rows(scaled_phases(8.5, scales, phase_s), 0.5, seed, max_len=MODELS[MODEL].max_len)
    with tempfile.TemporaryDirectory() as tmp:
        reqs = trace_workload(write_jsonl(rows, Path(tmp) / "burst.jsonl"))
    ppf = positions_per_forward(POSITIONS_PER_FORWARD[MODEL], 0.95)
    cost4 = gpu_cost(MODEL, "h100", block_length=BLOCK, tp=4)
    return with_slos(reqs, [slo_k * unloaded_latency_s(cost4, r.prompt_len, r.max_tokens, BLOCK, ppf) for r in reqs])


def digest(result, rc=None) -> tuple[str, int]:
    rows = [(r.seq, r.finish_reason, None if r.latency_s is None else round(r.latency_s, 9), r.forwards, r.tokens,
             list(r.thresholds)) for r in result.requests]
    counters = {k: v for k, v in sorted(vars(result.counters).items()) if isinstance(v, (int, float))} \
        if hasattr(result.counters, "__dict__") else repr(result.counters)
    regroups = None if rc is None else {
        "layouts": rc.layouts,
        "decisions": [(round(t, 6), d.get("regroup"), d.get("target"), d.get("why")) for t, d in rc.decisions]}
    blob = json.dumps({"requests": rows, "counters": counters, "regroups": regroups}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16], len(rows)


def main() -> None:
    torch.set_num_threads(1)
    cost = {d: gpu_cost(MODEL, "h100", block_length=BLOCK, tp=d) for d in (1, 2, 4, 8)}
    base = dict(block_length=BLOCK, threshold=0.9, token_budget=1024, max_waiting_requests=1 << 20,
                scheduling_policy="fcfs")
    slo = dict(threshold_policy="slo", slo_thresholds="0.95,0.9,0.8,0.7", quality_floor=0.7, load_control=True,
               routing="completion")
    reqs = requests([0.3, 0.9, 1.4, 0.5], 20.0, 3.0, seed=0)
    cases = [("2 prefill + 4 decode x TP1, hybrid, fixed 0.9", None,
              ServerConfig(**base, placement="hybrid", num_workers=4, num_prefill_workers=2,
                           overflow_threshold_tokens=4096), False),
             ("4 x TP4, fixed 0.9", [4] * 4, ServerConfig(**base), False),
             ("8 x TP2, slo + load control", [2] * 8, ServerConfig(**base, **slo), False),
             ("ILP reconfiguration from 8 x TP2", [2] * 8, ServerConfig(**base, **slo, reconfigure_period_s=10.0),
              True)]
    print(f"SIMULATED: {MODEL} on 16 x h100, {len(reqs)} requests (4 phases of 20 s, seed 0)")
    for name, degrees, config, reconf in cases:
        if degrees is None:      # a placement with prefill workers: one cost model for all
            shape = MODELS[MODEL]
            sim = Simulator(config, cost[1], ParametricBehaviour(MODEL, 0), shape.model_info(),
                            logit_shift=shape.logit_shift)
        else:
            sim = layout_simulator(degrees, cost.__getitem__, config, MODEL, 0)
        rc = reconfigurer(sim, cost.__getitem__, 10.0, (MODELS[MODEL].heads, MODELS[MODEL].kv_heads)) \
            if reconf else None
        res = sim.run(reqs if degrees else reqs[:150])
        h, n = digest(res, rc)
        extra = f", regroups {len(rc.records)}" if rc else ""
        print(f"  {name}: {n} requests, slo attainment {res.summary()['slo_attainment']:.4f}{extra}: digest {h}")


if __name__ == "__main__":
    main()
