"""SIMULATED: deadline-aware scheduling and the SLO policy against every fixed threshold, on static layouts of
16 H100-class devices serving LLaDA-8B under the BurstGPT-like trace of bench.sim_reconfig_static, for both
threshold-to-positions curves (sim/behaviour.py CURVES), SLO k = 1.5 and 3, seeds 0 and 1. Per cell: SLO
attainment overall and per phase and the mean block threshold of the SLO policy with deadline scheduling, the
policy with FCFS (before), and each fixed threshold of the ladder with FCFS and with deadline scheduling; then
the checks of docs/slo.md ("Deadline-aware scheduling").

    python -m bench.sim_deadline [--curves dilaserve,weak] [--slo-k 1.5,3] [--seeds 0,1] [--jobs 2] [--json out.json]
        [--configs slo --baseline earlier.json]     # rerun some configurations, the rest read from an earlier run
"""
from __future__ import annotations

import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from bench.harness import Table, parser, read_json, write_json
from bench.sim_reconfig_static import BLOCK, LADDER, base_config, phase_metrics, run_layout
from dllm_server.costmodel.gpu import MODELS, gpu_cost
from dllm_server.sim.behaviour import POSITIONS_PER_FORWARD, positions_per_forward
from dllm_server.sim.instances import layout_degrees, layout_name, unloaded_latency_s, with_slos
from dllm_server.sim.workload import trace_workload
from loadgen.burst import burst_rows, scaled_phases, write_jsonl

MODEL = "llada-8b"
SCALES = (0.3, 0.9, 1.4, 0.5)
FIXED = tuple(float(t) for t in LADDER.split(","))
CONFIGS = ("slo", "slo fcfs", *(f"fixed {t:g}" for t in FIXED), *(f"fixed {t:g} + deadline" for t in FIXED))
_COSTS: dict = {}


def cost_for(d: int):
    if d not in _COSTS:
        _COSTS[d] = gpu_cost(MODEL, "h100", block_length=BLOCK, tp=d)
    return _COSTS[d]


def trace(slo_k: float, seed: int, reference: float, phase_s: float):
    """The requests with their SLOs (k x the unloaded TP4 latency at 0.95), and each one's phase."""
    rows = burst_rows(scaled_phases(reference, list(SCALES), phase_s), 0.5, seed, max_len=MODELS[MODEL].max_len)
    with tempfile.TemporaryDirectory() as tmp:
        requests = trace_workload(write_jsonl(rows, Path(tmp) / "burst.jsonl"))
    ppf = positions_per_forward(POSITIONS_PER_FORWARD[MODEL], 0.95)
    slos = [slo_k * unloaded_latency_s(cost_for(4), r.prompt_len, r.max_tokens, BLOCK, ppf) for r in requests]
    return with_slos(requests, slos), [r["phase"] for r in rows]


def config_of(name: str):
    if name == "slo":
        return base_config(scheduling_policy="deadline")
    if name == "slo fcfs":
        return base_config(scheduling_policy="fcfs")
    threshold = float(name.split()[1])
    return base_config(threshold_policy="fixed", threshold=threshold,
                       scheduling_policy="deadline" if name.endswith("deadline") else "fcfs")


def job(args) -> dict:
    curve, slo_k, seed, d, name, reference, phase_s = args
    torch.set_num_threads(1)
    requests, phase_of = trace(slo_k, seed, reference, phase_s)
    t0 = time.process_time()
    res, _ = run_layout(requests, layout_degrees({d: 16 // d}), cost_for, config_of(name), MODEL, seed, curve)
    return {"curve": curve, "slo_k": slo_k, "seed": seed, "degree": d, "config": name,
            "metrics": phase_metrics(res, phase_of, len(SCALES)), "cpu_s": time.process_time() - t0,
            "requests": len(requests), "median_slo_s": statistics.median(r.slo_ms for r in requests) / 1e3}


def checks(cell: dict[str, dict]) -> dict:
    """The policy (deadline scheduling) against the fixed ladder in one cell (curve, k, seed, layout)."""
    pol = cell["slo"]["metrics"]
    fixed_fcfs = [cell[f"fixed {t:g}"]["metrics"] for t in FIXED]
    every = [cell[c]["metrics"] for c in CONFIGS if c.startswith("fixed")]
    best = max(m["overall"]["attainment"] for m in fixed_fcfs)
    best_any = max(m["overall"]["attainment"] for m in every)
    phase_gap = min(pol["phases"][k]["attainment"] - max(m["phases"][k]["attainment"] for m in every)
                    for k in range(len(SCALES)))
    return {"vs_best_fixed": pol["overall"]["attainment"] - best, "vs_best_fixed_any_order":
            pol["overall"]["attainment"] - best_any, "worst_phase_gap": phase_gap,
            "vs_fixed_0.9": pol["overall"]["attainment"] - cell["fixed 0.9"]["metrics"]["overall"]["attainment"]}


def main() -> None:
    ap = parser(__doc__, json_out=True)
    ap.add_argument("--curves", default="dilaserve,weak")
    ap.add_argument("--slo-k", default="1.5,3")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--layouts", default="1,2,4")
    ap.add_argument("--reference-rate", type=float, default=8.0, help="req/s the phase scales multiply (16 x TP1's "
                    "simulated capacity at fixed 0.9, bench.sim_reconfig_static)")
    ap.add_argument("--phase-s", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=2, help="simulations run at once (one core each)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="the configurations to run")
    ap.add_argument("--baseline", default=None, help="an earlier run's JSON: the configurations not run are read "
                    "from it (the same trace arguments)")
    a = ap.parse_args()
    run_names = a.configs.split(",")
    unknown = set(run_names) - set(CONFIGS)
    if unknown or (set(run_names) != set(CONFIGS) and not a.baseline):
        ap.error(f"--configs: {sorted(unknown)} unknown" if unknown else "--configs other than all needs --baseline")
    curves, ks = a.curves.split(","), [float(k) for k in a.slo_k.split(",")]
    seeds, layouts = [int(s) for s in a.seeds.split(",")], [int(d) for d in a.layouts.split(",")]
    jobs = [(c, k, s, d, n, a.reference_rate, a.phase_s) for c in curves for k in ks for s in seeds
            for d in layouts for n in run_names]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as pool:
        results = list(pool.map(job, jobs))
    if a.baseline:
        kept = {(r["curve"], r["slo_k"], r["seed"], r["degree"]) for r in results}
        results += [r for r in read_json(a.baseline)["runs"] if r["config"] not in run_names
                    and (r["curve"], r["slo_k"], r["seed"], r["degree"]) in kept]
    print(f"SIMULATED (roofline cost model, parametric behaviour; no GPU ran): {MODEL} on 16 x h100, the "
          f"BurstGPT-like trace at {', '.join(f'{s:g}x' for s in SCALES)} of {a.reference_rate:g} req/s, "
          f"{a.phase_s:g}-s phases; SLO = k x unloaded TP4 latency at 0.95; the slo policy: ladder {LADDER}, floor "
          f"0.7, load control, routing completion, tau 1024; curves: dilaserve (0.9 -> 0.7 saves 38 % of the "
          f"steps; 3.01 positions a forward at 0.9) and weak (saves 15 %); {len(jobs)} runs, "
          f"{time.perf_counter() - t0:.0f} s wall" + (f"; {', '.join(sorted(set(CONFIGS) - set(run_names)))} read "
                                                     f"from {a.baseline}" if a.baseline else "") + "\n")
    by_cell: dict = {}
    for r in results:
        by_cell.setdefault((r["curve"], r["slo_k"], r["seed"], r["degree"]), {})[r["config"]] = r
    verdicts = []
    for c in curves:
        for k in ks:
            for s in seeds:
                median = by_cell[(c, k, s, layouts[0])]["slo"]["median_slo_s"]
                print(f"\n### curve {c}, SLO k = {k:g}, seed {s} (median SLO {median:.2f} s)\n")
                table = Table(["layout", "configuration", "SLO attainment", *(f"phase {i + 1}" for i in range(4)),
                               ("mean threshold", ".3f")])
                for d in layouts:
                    cell = by_cell[(c, k, s, d)]
                    for name in CONFIGS:
                        m = cell[name]["metrics"]
                        table.row(layout_name(layout_degrees({d: 16 // d})), name,
                                  f"{100 * m['overall']['attainment']:.1f} %",
                                  *(f"{100 * p['attainment']:.1f} %" for p in m["phases"]), m["overall"]["mean_threshold"])
                    v = checks(cell)
                    verdicts.append({"curve": c, "slo_k": k, "seed": s, "degree": d, **v})
    print("\n### Checks (points of SLO attainment; the policy runs with deadline scheduling)\n")
    table = Table(["curve", "k", "seed", "layout", "policy - best fixed (FCFS)", "policy - best fixed (any order)",
                   "worst phase vs best fixed", "policy - fixed 0.9"])
    for v in verdicts:
        table.row(v["curve"], v["slo_k"], v["seed"], layout_name(layout_degrees({v["degree"]: 16 // v["degree"]})),
                  *(f"{100 * v[x]:+.1f}" for x in ("vs_best_fixed", "vs_best_fixed_any_order", "worst_phase_gap",
                                                  "vs_fixed_0.9")))
    ok = [v["vs_best_fixed"] >= 0 for v in verdicts]
    print(f"\npolicy >= every fixed threshold (FCFS) overall: {sum(ok)} of {len(ok)} cells; >= with deadline "
          f"scheduling too: {sum(v['vs_best_fixed_any_order'] >= 0 for v in verdicts)}; within 2 points of the best "
          f"in every phase: {sum(v['worst_phase_gap'] >= -0.02 for v in verdicts)}")
    if a.json:
        write_json(a.json, {"simulated": True, "args": vars(a), "runs": results, "checks": verdicts})


if __name__ == "__main__":
    main()
