"""Solve times of the cluster planner's two MILPs (cluster/layout_ilp.py: plan_capacity, stage 1;
cluster/transition.py: plan_transition, stage 2), scipy's HiGHS call included, at 16 devices
(2 nodes x 8) and 64 (8 x 8), median and p99 over random inputs. CPU time on this machine only:
no GPU is involved.

Inputs, SIMULATED: the capacity table C[d, tau] (cluster/capacity_table.py) from the LLaDA-8B
roofline on H100 at each degree (costmodel/gpu.py: gpu_cost("llada-8b", "h100", tp=d)); requests of
a 256-token prompt and a 256-token answer in blocks of 32 (canvas 512, R = 8 recompute steps);
forwards per request at each threshold ASSUMED to be 256 / ppf(tau), ppf the simulator's
positions-per-forward table (sim/behaviour.py: POSITIONS_PER_FORWARD, 3.01 at 0.9 from
Fast-dLLM, 4.85 at 0.7 an assumption, linear between, 1.0 at 1.0), every forward (the block's
recompute step too) committing ppf positions; the SLO budget 2 s (0.8 x a 2.5 s SLO). Per input: a
rate drawn between 5 % and 120 % of what the devices serve at the lowest threshold (so some
overloads), a random aligned current layout with 0-20 active requests per instance, and stage 2
run from it to stage 1's counts.

    .venv/bin/python bench/planner_solve.py [--inputs 50] [--seed 0]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_server.cluster.capacity_table import capacity_table, from_roofline, roofline_seats  # noqa: E402
from dllm_server.cluster.layout_ilp import plan_capacity  # noqa: E402
from dllm_server.cluster.transition import Slot, candidate_slots, plan_transition  # noqa: E402
from dllm_server.sim.behaviour import POSITIONS_PER_FORWARD, positions_per_forward  # noqa: E402
from dllm_server.costmodel.gpu import gpu_cost  # noqa: E402

DEGREES = (1, 2, 4, 8)
THRESHOLDS = (0.95, 0.9, 0.8, 0.7)
ANSWER_TOKENS, BLOCK, CANVAS, SLO_S = 256, 32, 512, 2.0


def random_layout(rng, gpus_per_node: int, num_nodes: int) -> list[Slot]:
    out = []
    for node in range(num_nodes):
        g = 0
        while g < gpus_per_node:
            d = int(rng.choice([d for d in DEGREES if g % d == 0 and g + d <= gpus_per_node]))
            out.append(Slot(node, g, d))
            g += d
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    costs = {d: gpu_cost("llada-8b", "h100", block_length=BLOCK, tp=d) for d in DEGREES}
    forwards = [ANSWER_TOKENS / positions_per_forward(POSITIONS_PER_FORWARD["llada-8b"], t) for t in THRESHOLDS]
    t0 = time.perf_counter()
    cap = capacity_table(DEGREES, THRESHOLDS, from_roofline(costs), forwards, ANSWER_TOKENS / BLOCK, CANVAS, SLO_S,
                         roofline_seats(costs, CANVAS))
    table_ms = 1e3 * (time.perf_counter() - t0)
    print(f"SIMULATED inputs (LLaDA-8B roofline, H100); {a.inputs} random inputs per size, seed {a.seed}\n")
    print("C[d, tau] (req/s per instance; F = forwards per request): "
          + "; ".join(f"tau {t} (F {f:.0f}): " + ", ".join(f"TP{d} {cap[(d, t)]:.2f}" for d in DEGREES)
                      for t, f in zip(THRESHOLDS, forwards)) + f"  [table built in {table_ms:.0f} ms]\n")
    print("| devices | stage | variables | constraint rows | median (ms) | p99 (ms) | overloaded inputs |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(a.seed)
    plan_transition([], plan_capacity(cap, DEGREES, THRESHOLDS, 8, 1.0).counts, 8, 1)   # scipy's import: untimed
    for num_nodes in (2, 8):
        gpus = 8 * num_nodes
        most = max(0.7 * c / d for (d, _), c in cap.items()) * gpus
        s1, s2, overloaded = [], [], 0
        for _ in range(a.inputs):
            rate = float(rng.uniform(0.05, 1.2)) * most
            t = time.perf_counter()
            plan = plan_capacity(cap, DEGREES, THRESHOLDS, gpus, rate)
            s1.append(time.perf_counter() - t)
            overloaded += not plan.feasible
            current = random_layout(rng, 8, num_nodes)
            active = rng.integers(0, 21, len(current)).tolist()
            t = time.perf_counter()
            plan_transition(current, plan.counts, 8, num_nodes, active=active)
            s2.append(time.perf_counter() - t)
        k = len(DEGREES) * len(THRESHOLDS)
        slots = len(candidate_slots(8, num_nodes, DEGREES))
        for stage, times, variables, rows in (
                ("1 plan_capacity", s1, f"{k} integer + {k + 1} continuous", f"{k + 2}"),
                ("2 plan_transition", s2, f"<= {slots} binary", f"<= {gpus + len(DEGREES)}")):
            ms = 1e3 * np.asarray(times)
            print(f"| {gpus} ({num_nodes} x 8) | {stage} | {variables} | {rows} | {np.median(ms):.1f} | "
                  f"{np.percentile(ms, 99):.1f} | {overloaded if stage.startswith('1') else ''} |")


if __name__ == "__main__":
    main()
