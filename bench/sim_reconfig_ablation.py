"""SIMULATED: the attainment planner with one part taken out at a time, on bench/sim_reconfig.py's trace: SLO
attainment overall and per phase, and the regroups, of the reconfiguring run under each variant.

    python -m bench.sim_reconfig_ablation [--slo-k 1.5] [--phase-s 120] [--seed 0]

Variants: the full planner; regroups all at once (no waves); the linear 1/d prior for unmeasured degrees (no
serial share); no restart price; one SLO class (every request at the median budget); no floor from what the
current layout met; no headroom rule for moves made for the tail alone; a memory of one period (no busiest recent
period, no load the cluster was sized for); DiLaServe's MILP planner instead.
"""
from __future__ import annotations

import dataclasses
import sys
from contextlib import contextmanager

import numpy as np
import torch

from bench.harness import Table, parser
from bench.sim_reconfig import REFERENCE_RATE, burst_requests, costs_by_degree, regroups_per_phase, run
from bench.sim_reconfig_static import base_config, phase_metrics
from dllm_server.cluster import planner
from dllm_server.sim.instances import layout_degrees
from dllm_server.sim.regroup import ASSUMED_RESTART_S


@contextmanager
def patched(**values):
    """Module constants of cluster/planner.py set for one run (the ablations the config has no flag for)."""
    old = {k: getattr(planner, k) for k in values}
    for k, v in values.items():
        setattr(planner, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(planner, k, v)


def one_class(policy, arrivals, now, period_s):
    demand = ONE_CLASS_BASE(policy, arrivals, now, period_s)
    if demand is None:
        return None
    return dataclasses.replace(demand, budgets_s=np.full_like(demand.budgets_s, np.median(demand.budgets_s)))


ONE_CLASS_BASE = planner.sample_demand
VARIANTS = {
    "full attainment planner": ({}, {}),
    "no waves (all at once)": ({"reconfigure_wave_share": 1.0}, {}),
    "no prior serial share (1/d)": ({"reconfigure_prior_serial_share": 0.0}, {}),
    "no restart price": ({}, {"HORIZON_PERIODS": float("inf")}),
    "one SLO class (median budget)": ({}, {"sample_demand": one_class}),
    "no floor from what worked": ({}, {"MIN_OUTCOMES": 1 << 30}),
    "no headroom for tail moves": ({}, {"HEADROOM": 0.0}),
    "no memory (one period: no sized-for load)": ({"reconfigure_memory_periods": 1}, {}),
    "ILP planner (DiLaServe's MILP)": ({"reconfigure_planner": "ilp"}, {}),
}


def main() -> None:
    ap = parser(__doc__, seed=0)
    ap.add_argument("--slo-k", type=float, default=1.5)
    ap.add_argument("--phase-s", type=float, default=120.0)
    ap.add_argument("--period-s", type=float, default=30.0)
    ap.add_argument("--restart-s", type=float, default=ASSUMED_RESTART_S)
    ap.add_argument("--devices", type=int, default=16)
    ap.add_argument("--start", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cost_for = costs_by_degree()
    scales = [0.3, 0.9, 1.4, 0.5]
    requests, phases, phase_of = burst_requests(REFERENCE_RATE, scales, a.phase_s, 0.5, a.slo_k, cost_for(4), a.seed)
    print(f"SIMULATED (roofline H100 costs, parametric behaviour): the trace and settings of bench/sim_reconfig.py, "
          f"SLO k = {a.slo_k:g}, {a.phase_s:g}-s phases, seed {a.seed}, start {a.devices // a.start} x TP{a.start}, "
          f"planner every {a.period_s:g} s, ASSUMED restart {a.restart_s:g} s\n")
    table = Table(["variant", "overall", "phase 1", "phase 2", "phase 3", "phase 4", "mean threshold", "regroups"],
                  "reconfiguring run per variant (SIMULATED)")
    for name, (config_over, constants) in VARIANTS.items():
        config = base_config(reconfigure_period_s=a.period_s, reconfigure_restart_s=a.restart_s, **config_over)
        with patched(**constants):
            res, rc, cpu = run(requests, layout_degrees({a.start: a.devices // a.start}), cost_for, config, a.seed,
                               True, a.restart_s)
        m = phase_metrics(res, phase_of, len(phases))
        table.row(name, *(f"{100 * p['attainment']:.1f} %" for p in [m["overall"], *m["phases"]]),
                  f"{m['overall']['mean_threshold']:.3f}", "/".join(map(str, regroups_per_phase(rc, phases))))
        print(f"  {name}: {cpu:.0f} s CPU", file=sys.stderr)


if __name__ == "__main__":
    main()
