"""The simulator's own speed: 10,000 ShareGPT-shaped requests on 8 simulated colocated workers, one
process: wall and CPU time (the figure to compare on a shared machine), events, iterations; --profile.

    python -m bench.sim_speed [--requests 10000] [--rate 8] [--workers 8] [--profile]
"""
from __future__ import annotations

import cProfile
import os
import pstats
import time

import torch

from bench.harness import Timer, parser
from dllm_server.config import ServerConfig
from dllm_server.sim.behaviour import ParametricBehaviour
from dllm_server.sim.cluster import Simulator
from dllm_server.costmodel.gpu import MODELS, gpu_cost
from dllm_server.sim.workload import preset_workload


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--rate", type=float, default=8.0,
                    help="req/s; 8 is 80 %% of the tau=1024 capacity bench/sim_paper.py A finds")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)                 # one core: the simulator's tensors are tiny anyway
    cost = gpu_cost("llada-8b", "h100")
    reqs = preset_workload("sharegpt", a.requests, a.rate, seed=0, max_len=4096)
    sim = Simulator(ServerConfig(num_workers=a.workers, num_pages=cost.kv_pool_tokens() // 16), cost,
                    ParametricBehaviour(), MODELS["llada-8b"].model_info(), record=True)
    before = os.getloadavg()
    prof = cProfile.Profile() if a.profile else None
    with Timer() as t:
        cpu = time.process_time()
        if prof:
            prof.enable()
        res = sim.run(reqs)
        if prof:
            prof.disable()
        cpu = time.process_time() - cpu
    wall = t.s
    s = res.summary()
    iters = sum(len(v) for v in res.iterations.values())
    rows = sum(r[2] + r[5] for v in res.iterations.values() for r in v)
    print(f"{a.requests} requests, {a.workers} workers: {wall:.1f} s wall, {cpu:.1f} s CPU (one process, one thread), "
          f"{res.num_events} events, "
          f"{iters} iterations, {rows} block-forwards ({rows / wall:,.0f} per s); simulated {s['makespan_s']:.0f} s, "
          f"{s['completed']} completed, mean {s['mean_s']:.2f} s, p99 {s['p99_s']:.2f} s; "
          f"loadavg {before[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
