"""SIMULATED: SLO-class routing (`--routing slo-class`) against routing by predicted completion, on static layouts
of 16 H100-class devices that mix tensor-parallel degrees, serving LLaDA-8B under bench.sim_deadline's trace (the
BurstGPT-like phases, SLO = k x the unloaded TP4 latency at 0.95), with the SLO policy and deadline scheduling. Per
cell: SLO attainment overall, per phase, for the tighter and the looser half of the SLOs, and the mean block
threshold; the homogeneous layouts of the same cell for reference.

    python -m bench.sim_slo_class [--layouts 4:2+2:4,4:2+1:8,2:4+1:8,4:4,2:8,1:16] [--curves dilaserve]
        [--slo-k 1.5,3] [--seeds 0,1] [--jobs 2] [--json out.json]
"""
from __future__ import annotations

import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from bench.harness import Table, parser, write_json
from bench.sim_deadline import MODEL, SCALES, config_of, cost_for, trace
from bench.sim_reconfig_static import phase_metrics, run_layout
from dllm_server.sim.instances import layout_degrees, layout_name

ROUTINGS = ("completion", "slo-class")


def parse_layout(text: str) -> tuple[int, ...]:
    """'4:2+2:4' (degree:instances, joined by +) -> one degree per instance."""
    return layout_degrees({int(d): int(n) for d, n in (part.split(":") for part in text.split("+"))})


def job(args) -> dict:
    curve, slo_k, seed, layout, routing, reference, phase_s = args
    torch.set_num_threads(1)
    requests, phase_of = trace(slo_k, seed, reference, phase_s)
    degrees = parse_layout(layout)
    config = config_of("slo").replace(routing=routing)
    t0 = time.process_time()
    res, _ = run_layout(requests, degrees, cost_for, config, MODEL, seed, curve)
    median = statistics.median(r.slo_ms for r in requests)
    tight = [r for r in res.requests if r.slo_ms <= median]
    loose = [r for r in res.requests if r.slo_ms > median]
    return {"curve": curve, "slo_k": slo_k, "seed": seed, "layout": layout, "routing": routing,
            "metrics": phase_metrics(res, phase_of, len(SCALES)), "cpu_s": time.process_time() - t0,
            "tight": sum(bool(r.slo_met) for r in tight) / len(tight),
            "loose": sum(bool(r.slo_met) for r in loose) / len(loose)}


def main() -> None:
    ap = parser(__doc__, json_out=True)
    ap.add_argument("--layouts", default="4:2+2:4,4:2+1:8,2:4+1:8,4:4,2:8,1:16",
                    help="degree:instances joined by +, 16 devices each; a homogeneous one runs by completion only")
    ap.add_argument("--curves", default="dilaserve")
    ap.add_argument("--slo-k", default="1.5,3")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--reference-rate", type=float, default=8.0)
    ap.add_argument("--phase-s", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=2, help="simulations run at once (one core each)")
    a = ap.parse_args()
    layouts, curves = a.layouts.split(","), a.curves.split(",")
    for lay in layouts:
        if sum(parse_layout(lay)) != 16:
            ap.error(f"--layouts: {lay} is not 16 devices")
    ks, seeds = [float(k) for k in a.slo_k.split(",")], [int(s) for s in a.seeds.split(",")]
    mixed = [lay for lay in layouts if "+" in lay]
    jobs = [(c, k, s, lay, r, a.reference_rate, a.phase_s) for c in curves for k in ks for s in seeds
            for lay in layouts for r in (ROUTINGS if lay in mixed else ROUTINGS[:1])]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as pool:
        results = list(pool.map(job, jobs))
    print(f"SIMULATED (roofline cost model, parametric behaviour; no GPU ran): {MODEL} on 16 x h100, the trace of "
          f"bench.sim_deadline ({', '.join(f'{s:g}x' for s in SCALES)} of {a.reference_rate:g} req/s, {a.phase_s:g}-s "
          f"phases), the SLO policy with load control and deadline scheduling; {len(jobs)} runs, "
          f"{time.perf_counter() - t0:.0f} s wall")
    by = {(r["curve"], r["slo_k"], r["seed"], r["layout"], r["routing"]): r for r in results}
    for c in curves:
        for k in ks:
            for s in seeds:
                print(f"\n### curve {c}, SLO k = {k:g}, seed {s}\n")
                t = Table(["layout", "routing", "SLO attainment", *(f"phase {i + 1}" for i in range(len(SCALES))),
                           "tighter half", "looser half", ("mean threshold", ".3f")])
                for lay in layouts:
                    for rt in (ROUTINGS if lay in mixed else ROUTINGS[:1]):
                        r = by[(c, k, s, lay, rt)]
                        m = r["metrics"]
                        t.row(layout_name(parse_layout(lay)), rt, f"{100 * m['overall']['attainment']:.1f} %",
                              *(f"{100 * p['attainment']:.1f} %" for p in m["phases"]), f"{100 * r['tight']:.1f} %",
                              f"{100 * r['loose']:.1f} %", m["overall"]["mean_threshold"])
    if a.json:
        write_json(a.json, {"simulated": True, "args": vars(a), "runs": results})


if __name__ == "__main__":
    main()
