"""Solve times of the cluster planner's two MILPs (stage 1 plan_capacity, stage 2 plan_transition), HiGHS
included, at 16 and 64 devices, median and p99 over random SIMULATED inputs; CPU time only.

    python -m bench.planner_solve [--inputs 50] [--seed 0] [--json out.json]
"""
from __future__ import annotations

import numpy as np

from bench.harness import Report, Timer, parser
from dllm_server.cluster.capacity_table import capacity_table, from_roofline, roofline_seats
from dllm_server.cluster.layout_ilp import plan_capacity
from dllm_server.cluster.transition import Slot, candidate_slots, plan_transition
from dllm_server.costmodel.gpu import gpu_cost
from dllm_server.sim.behaviour import POSITIONS_PER_FORWARD, positions_per_forward

# The inputs: C[d, tau] from the LLaDA-8B roofline on H100 at each degree; requests of a 256-token
# prompt and answer in blocks of 32 (canvas 512, 8 recompute steps); forwards per request ASSUMED
# 256 / ppf(tau) (sim/behaviour.py's table); the SLO budget 2 s (0.8 x a 2.5 s SLO). Per input: a
# rate between 5 % and 120 % of what the devices serve at the lowest threshold (some overloads), a
# random aligned current layout with 0-20 active requests per instance, stage 2 run from it.
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
    ap = parser(__doc__, seed=0, json_out=True)
    ap.add_argument("--inputs", type=int, default=50)
    a = ap.parse_args()
    costs = {d: gpu_cost("llada-8b", "h100", block_length=BLOCK, tp=d) for d in DEGREES}
    forwards = [ANSWER_TOKENS / positions_per_forward(POSITIONS_PER_FORWARD["llada-8b"], t) for t in THRESHOLDS]
    with Timer() as t:
        cap = capacity_table(DEGREES, THRESHOLDS, from_roofline(costs), forwards, ANSWER_TOKENS / BLOCK, CANVAS,
                             SLO_S, roofline_seats(costs, CANVAS))
    table_ms = 1e3 * t.s
    print(f"SIMULATED inputs (LLaDA-8B roofline, H100); {a.inputs} random inputs per size, seed {a.seed}\n")
    print("C[d, tau] (req/s per instance; F = forwards per request): "
          + "; ".join(f"tau {t} (F {f:.0f}): " + ", ".join(f"TP{d} {cap[(d, t)]:.2f}" for d in DEGREES)
                      for t, f in zip(THRESHOLDS, forwards)) + f"  [table built in {table_ms:.0f} ms]\n")
    report = Report(a.json)
    table = report.table(["devices", "stage", "variables", "constraint rows", ("median (ms)", ".1f"),
                          ("p99 (ms)", ".1f"), "overloaded inputs"])
    rng = np.random.default_rng(a.seed)
    plan_transition([], plan_capacity(cap, DEGREES, THRESHOLDS, 8, 1.0).counts, 8, 1)   # scipy's import: untimed
    for num_nodes in (2, 8):
        gpus = 8 * num_nodes
        most = max(0.7 * c / d for (d, _), c in cap.items()) * gpus
        s1, s2, overloaded = [], [], 0
        for _ in range(a.inputs):
            rate = float(rng.uniform(0.05, 1.2)) * most
            with Timer() as t:
                plan = plan_capacity(cap, DEGREES, THRESHOLDS, gpus, rate)
            s1.append(t.s)
            overloaded += not plan.feasible
            current = random_layout(rng, 8, num_nodes)
            active = rng.integers(0, 21, len(current)).tolist()
            with Timer() as t:
                plan_transition(current, plan.counts, 8, num_nodes, active=active)
            s2.append(t.s)
        k = len(DEGREES) * len(THRESHOLDS)
        slots = len(candidate_slots(8, num_nodes, DEGREES))
        for stage, times, variables, rows in (
                ("1 plan_capacity", s1, f"{k} integer + {k + 1} continuous", f"{k + 2}"),
                ("2 plan_transition", s2, f"<= {slots} binary", f"<= {gpus + len(DEGREES)}")):
            ms = 1e3 * np.asarray(times)
            table.row(f"{gpus} ({num_nodes} x 8)", stage, variables, rows, np.median(ms), np.percentile(ms, 99),
                      overloaded if stage.startswith("1") else "")
    report.save()


if __name__ == "__main__":
    main()
