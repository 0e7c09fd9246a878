"""SIMULATED (GPU roofline; our real scheduler and worker core): LLaDA-8B against SDAR-8B on one H100, the
same requests and commits (2 positions per forward): 1 saturation, 2 Poisson arrivals at a few rates.

    python -m bench.sim_block_causal [--requests 400] [--device h100] [--rates 1 2 4] [--json out.json]
"""
from __future__ import annotations

import dataclasses
import statistics

from bench.harness import Report, parser
from dllm_server.config import ServerConfig
from dllm_server.costmodel.gpu import MODELS, gpu_cost
from dllm_server.decoding.canvas import num_blocks
from dllm_server.sim.behaviour import ParametricBehaviour
from dllm_server.sim.cluster import Simulator
from dllm_server.sim.workload import preset_workload

# LLaDA: the dual cache and a full-canvas re-prefill every block (32, its Fast-dLLM setting, and 4);
# SDAR: exact KV, one prefill, block-sized steps, the fused finalise (block 4, its trained size).
# Assumed (printed): the roofline's efficiencies, SDAR-8B's shape (MODELS), ShareGPT-shaped lengths,
# answers to their output length, no prefix cache hits.
SETUPS = (("llada-8b", 32), ("llada-8b", 4), ("sdar-8b", 4))


def _with_steps(reqs, block: int, absolute: bool):
    """Each request: a fixed 2 positions per forward (at least one forward per block)."""
    return [dataclasses.replace(r, steps=max(num_blocks(r.max_tokens, block, r.prompt_len, absolute),
                                             -(-r.max_tokens // 2))) for r in reqs]


def _run(model: str, block: int, reqs, device: str):
    shape = MODELS[model]
    cost = gpu_cost(model, device, block_length=block)
    cfg = ServerConfig(block_length=block, max_waiting_requests=1 << 20, page_size=16,
                       num_pages=cost.kv_pool_tokens() // 16)
    sim = Simulator(cfg, cost, ParametricBehaviour("llada-8b"), shape.model_info(), logit_shift=shape.logit_shift)
    return sim.run(_with_steps(reqs, block, shape.block_size > 0))


def main() -> None:
    ap = parser(__doc__, json_out=True)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--device", default="h100", choices=("h100", "h200"))
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    a = ap.parse_args()
    print(f"SIMULATED on one {a.device} (roofline; costmodel/gpu.py), ShareGPT-shaped lengths, fixed 2 positions "
          f"per forward, {a.requests} requests\n")
    burst = preset_workload("sharegpt", a.requests, 1e9, seed=1, max_len=4096)
    report = Report(a.json)
    table = report.table(["model", "block", "req/s", ("answer tok/s", ",.0f"), ("forwards/answer", ".1f"),
                          ("mean latency (s)", ".1f")], "1. saturation (all at t=0)")
    base = None
    for model, block in SETUPS:
        res = _run(model, block, burst, a.device)
        done = [r for r in res.requests if r.latency_s is not None]
        rate = len(done) / res.makespan_s
        base = base or rate
        table.row(model, block, f"{rate:.2f} ({rate / base:.2f}x)", sum(r.tokens for r in done) / res.makespan_s,
                  statistics.mean(r.forwards for r in done), statistics.mean(r.latency_s for r in done))
    table = report.table(["model", "block", ("rate (req/s)", "g"), ("mean latency (s)", ".2f"), ("p90 (s)", ".2f")],
                         "\n2. open loop (Poisson)")
    for rate in a.rates:
        reqs = preset_workload("sharegpt", a.requests, rate, seed=2, max_len=4096)
        for model, block in SETUPS:
            lat = sorted(r.latency_s for r in _run(model, block, reqs, a.device).requests if r.latency_s is not None)
            table.row(model, block, rate, statistics.mean(lat), lat[int(0.9 * (len(lat) - 1))])
    c = gpu_cost("sdar-8b", a.device, block_length=4).describe()
    print(f"\nassumptions: {MODELS['sdar-8b'].source}; efficiencies {c['efficiency']}")
    report.add(assumptions={"sdar-8b": MODELS["sdar-8b"].source, "efficiency": c["efficiency"]})
    report.save()


if __name__ == "__main__":
    main()
