"""SIMULATED (GPU roofline, costmodel/gpu.py; our real scheduler and worker core): LLaDA-8B against
SDAR-8B on one H100, the same requests and the same commits (a fixed 2 positions per forward,
so only the forward structure differs): LLaDA with the dual cache and a full-canvas re-prefill at
every block (block 32, its Fast-dLLM setting, and block 4), SDAR with exact KV, one prefill, a
block-sized step and the fused finalise (block 4, its trained size).

  1. saturation: N requests at t=0, completion rate and mean forwards per answer;
  2. open loop: Poisson arrivals at a few rates, mean and p90 latency.

    python bench/sim_block_causal.py [--requests 400] [--device h100]

Assumptions (printed): the roofline's efficiencies (costmodel/gpu.py), SDAR-8B's shape (Qwen3-8B's,
named in MODELS), ShareGPT-shaped lengths (loadgen preset), answers to their output length
(EOS ignored), no prefix cache hits (distinct prompts).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_server.config import ServerConfig  # noqa: E402
from dllm_server.decoding.canvas import num_blocks  # noqa: E402
from dllm_server.sim.behaviour import ParametricBehaviour  # noqa: E402
from dllm_server.sim.cluster import Simulator  # noqa: E402
from dllm_server.costmodel.gpu import MODELS, gpu_cost  # noqa: E402
from dllm_server.sim.workload import preset_workload  # noqa: E402

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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--device", default="h100", choices=("h100", "h200"))
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    a = ap.parse_args()
    print(f"SIMULATED on one {a.device} (roofline; costmodel/gpu.py), ShareGPT-shaped lengths, fixed 2 positions "
          f"per forward, {a.requests} requests\n")
    burst = preset_workload("sharegpt", a.requests, 1e9, seed=1, max_len=4096)
    print("1. saturation (all at t=0)\n| model | block | req/s | answer tok/s | forwards/answer | mean latency (s) |\n"
          "|---|---|---|---|---|---|")
    base = None
    for model, block in SETUPS:
        res = _run(model, block, burst, a.device)
        done = [r for r in res.requests if r.latency_s is not None]
        rate = len(done) / res.makespan_s
        base = base or rate
        print(f"| {model} | {block} | {rate:.2f} ({rate / base:.2f}x) | {sum(r.tokens for r in done) / res.makespan_s:,.0f} | "
              f"{statistics.mean(r.forwards for r in done):.1f} | {statistics.mean(r.latency_s for r in done):.1f} |")
    print("\n2. open loop (Poisson)\n| model | block | rate (req/s) | mean latency (s) | p90 (s) |\n|---|---|---|---|---|")
    for rate in a.rates:
        reqs = preset_workload("sharegpt", a.requests, rate, seed=2, max_len=4096)
        for model, block in SETUPS:
            lat = sorted(r.latency_s for r in _run(model, block, reqs, a.device).requests if r.latency_s is not None)
            print(f"| {model} | {block} | {rate:g} | {statistics.mean(lat):.2f} | {lat[int(0.9 * (len(lat) - 1))]:.2f} |")
    c = gpu_cost("sdar-8b", a.device, block_length=4).describe()
    print(f"\nassumptions: {MODELS['sdar-8b'].source}; efficiencies {c['efficiency']}")


if __name__ == "__main__":
    main()
