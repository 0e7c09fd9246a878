"""SIMULATED: the planner's predicted SLO attainment (cluster/attainment.py) beside the simulated one, per static
layout and phase of bench/sim_reconfig.py's trace, and whether the model names each phase's winner.

    python -m bench.planner_fit [--slo-k 3] [--phase-s 60] [--seed 0] [--json out.json]

The model is given an oracle forecast of each phase: the phase's own requests (budgets, forwards per threshold
from the simulator's positions-per-forward curve, blocks, canvases) and its 5-s arrival rates. So a gap here is
the model's error alone, not the forecast's.
"""
from __future__ import annotations

import math
import sys

import numpy as np
import torch

from bench.harness import Table, parser, write_json
from bench.sim_reconfig import MODEL, REFERENCE_RATE, burst_requests, run
from bench.sim_reconfig_static import BLOCK, LADDER, base_config, phase_metrics
from dllm_server.cluster.attainment import Demand, InstanceModel, layouts, predict, window_rates
from dllm_server.cluster.capacity_table import from_roofline, roofline_seats
from dllm_server.costmodel.gpu import gpu_cost
from dllm_server.sim.behaviour import POSITIONS_PER_FORWARD, positions_per_forward
from dllm_server.sim.instances import layout_degrees, layout_name

DEGREES = (1, 2, 4)


def block_forwards(max_tokens: int, threshold: float) -> int:
    """Forwards a request's blocks take at `threshold` (the simulator's mean positions per forward)."""
    ppf = positions_per_forward(POSITIONS_PER_FORWARD[MODEL], threshold)
    full, rest = divmod(max_tokens, BLOCK)
    return full * max(1, math.ceil(BLOCK / ppf)) + (max(1, math.ceil(rest / ppf)) if rest else 0)


def rank(p) -> tuple:
    """The planner's order: attainment (to half a point), then the shorter tail."""
    return round(p.attainment * 200), -p.tail_s


def phase_demands(requests, phase_of, phases, thresholds) -> list[Demand]:
    """Each phase's requests and window rates: the forecast a perfect predictor of the phase would give."""
    out, start = [], 0.0
    for k, (span, _) in enumerate(phases):
        rs = [r for r, p in zip(requests, phase_of) if p == k]
        gaps = np.diff([r.arrival_s for r in rs])
        out.append(Demand(
            budgets_s=np.array([r.slo_ms / 1e3 for r in rs]),
            forwards=np.array([[block_forwards(r.max_tokens, t) for t in thresholds] for r in rs], dtype=float),
            blocks=np.array([math.ceil(r.max_tokens / BLOCK) for r in rs], dtype=float),
            canvases=np.array([r.prompt_len + r.max_tokens for r in rs], dtype=float),
            thresholds=thresholds,
            window_rates=window_rates([r.arrival_s for r in rs], start + span, span),
            arrival_cv2=float(gaps.var() / gaps.mean() ** 2) if len(gaps) > 1 else 1.0))
        start += span
    return out


def main() -> None:
    ap = parser(__doc__, seed=0)
    ap.add_argument("--devices", type=int, default=16)
    ap.add_argument("--scales", default="0.3,0.9,1.4,0.5", help="each phase's rate / the reference rate")
    ap.add_argument("--phase-s", type=float, default=60.0)
    ap.add_argument("--shape", type=float, default=0.5, help="Gamma shape of the gaps (0.5: CV 1.41)")
    ap.add_argument("--slo-k", type=float, default=3.0, help="SLO = k x the unloaded TP4 latency at 0.95")
    ap.add_argument("--routing", default="completion", choices=("completion", "load"), help="the runs' --routing")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    costs = {d: gpu_cost(MODEL, "h100", block_length=BLOCK, tp=d) for d in DEGREES}
    scales = [float(s) for s in a.scales.split(",")]
    requests, phases, phase_of = burst_requests(REFERENCE_RATE, scales, a.phase_s, a.shape, a.slo_k, costs[4],
                                                a.seed)
    config = base_config(routing=a.routing)
    thresholds = tuple(float(t) for t in LADDER.split(","))
    demands = phase_demands(requests, phase_of, phases, thresholds)
    canvas = int(np.mean([r.prompt_len + r.max_tokens for r in requests]))
    iteration_s, seats = from_roofline(costs), roofline_seats(costs, canvas, config.max_active_decodes)
    statics = {d: {d: a.devices // d} for d in DEGREES}
    print(f"SIMULATED (roofline cost model, parametric behaviour; no GPU ran): {MODEL} on {a.devices} x h100, the "
          f"trace of bench/sim_reconfig.py ({len(phases)} phases x {a.phase_s:g} s at {a.scales} x "
          f"{REFERENCE_RATE:.2f} req/s, Gamma shape {a.shape:g}, seed {a.seed}), SLO k = {a.slo_k:g}, routing "
          f"{a.routing}; predicted: cluster/attainment.py with an oracle forecast of each phase, load target "
          f"{config.load_target:g}\n")
    predicted = []
    for dem in demands:
        models = {d: InstanceModel(iteration_s, d, seats[d], dem, len(thresholds) - 1,
                                   token_budget=config.token_budget, credit_share=config.credit_share,
                                   row_tokens=BLOCK) for d in DEGREES}
        every = {layout_name(layout_degrees(lay)): predict(lay, models, dem, config.load_target)
                 for lay in layouts(a.devices, DEGREES)}
        best = max(every, key=lambda n: rank(every[n]))
        predicted.append({"static": {d: every[layout_name(layout_degrees(lay))] for d, lay in statics.items()},
                          "best": (best, every[best])})
    simulated, kept = {}, []
    for d, lay in statics.items():
        res, _, cpu = run(requests, layout_degrees(lay), costs.__getitem__, config, a.seed, False, 0.0)
        simulated[d] = phase_metrics(res, phase_of, len(phases))
        later = sum(max(0, len(r.thresholds) - 1) for r in res.requests)     # every block after a request's first
        simulated[d]["blocks_kept"] = res.counters.blocks_continued / max(1, later)
        kept.append(f"{layout_name(layout_degrees(lay))} {100 * simulated[d]['blocks_kept']:.1f} %")
        print(f"  {layout_name(layout_degrees(lay))}: {cpu:.0f} s CPU", file=sys.stderr)
    print("blocks after a request's first continued on the worker that ran the one before (leased): "
          + ", ".join(kept) + "\n")
    rows, gaps, right = [], [], 0
    table = Table(["phase", "layout", "predicted", "simulated", ("gap (points)", "+.1f"), "predicted tau",
                   "simulated tau"], "predicted vs simulated SLO attainment per static layout and phase (SIMULATED)")
    for k in range(len(phases)):
        for d, lay in statics.items():
            p, s = predicted[k]["static"][d], simulated[d]["phases"][k]
            gap = 100 * (p.attainment - s["attainment"])
            gaps.append(gap)
            table.row(f"{k + 1} ({scales[k]:g}x)", layout_name(layout_degrees(lay)), f"{100 * p.attainment:.1f} %",
                      f"{100 * s['attainment']:.1f} %", gap, f"{p.mean_threshold:.3f}", f"{s['mean_threshold']:.3f}")
            rows.append({"phase": k, "degree": d, "predicted": vars(p), "simulated": s})
        sim_best = max(DEGREES, key=lambda d: simulated[d]["phases"][k]["attainment"])
        pred_best = max(DEGREES, key=lambda d: rank(predicted[k]["static"][d]))
        right += simulated[pred_best]["phases"][k]["attainment"] >= simulated[sim_best]["phases"][k]["attainment"]
    print(f"\nwithin 10 points: {sum(abs(g) <= 10 for g in gaps)} of {len(gaps)}; largest gap "
          f"{max(gaps, key=abs):+.1f}; "
          f"the predicted best static layout is the simulated best (or ties it) in {right} of {len(phases)} phases")
    for k, p in enumerate(predicted):
        name, best = p["best"]
        print(f"phase {k + 1}: the model's best of all {len(layouts(a.devices, DEGREES))} layouts {name} "
              f"({100 * best.attainment:.1f} %, mean threshold {best.mean_threshold:.3f})")
    if a.json:
        write_json(a.json, {"simulated": True, "args": vars(a), "rows": rows,
                            "best": [(p["best"][0], vars(p["best"][1])) for p in predicted]})


if __name__ == "__main__":
    main()
