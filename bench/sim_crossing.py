"""SIMULATED: where the best static layout changes from one load phase to the next, and what reconfiguration
makes of it. A sweep of scenarios (SLO k, the phases' loads, long-prompt against long-answer phases, the trace's
burstiness) over static layouts of 16 H100-class devices serving LLaDA-8B under bench.sim_reconfig's policy and
routing. Per scenario: each layout per phase, each phase's best layout, the best single layout, and the oracle
(each phase on its own best layout, restarts free: what no reconfiguration can beat). Then, in every scenario
where the oracle gains at least --min-oracle points, the server's planner regrouping live (bench.sim_reconfig).

    python -m bench.sim_crossing [--slo-k 1.0,1.5,3] [--loads 0.3:0.9:1.4:0.5,0.15:1.5:0.15:1.5]
        [--mixes plain,prompt-answer,answer-prompt] [--shapes 0.5,2] [--phase-s 60] [--jobs 2] [--json out.json]
        [--baseline earlier.json]      # the static runs read from an earlier sweep: only the planner runs again
"""
from __future__ import annotations

import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from bench.harness import Table, parser, read_json, write_json
from bench.sim_reconfig import MODEL, REFERENCE_RATE, costs_by_degree, regroups_per_phase, run
from bench.sim_reconfig_static import BLOCK, base_config, phase_metrics
from dllm_server.costmodel.gpu import MODELS
from dllm_server.sim.behaviour import POSITIONS_PER_FORWARD, positions_per_forward
from dllm_server.sim.instances import layout_degrees, layout_name, unloaded_latency_s, with_slos
from dllm_server.sim.regroup import ASSUMED_RESTART_S
from dllm_server.sim.workload import trace_workload
from loadgen.burst import burst_rows, write_jsonl
from loadgen.workload import fit_lengths, preset_lengths

# Per phase (prompt, output) length multipliers, repeated over the phases: a long-prompt phase (3x the
# prompt, half the answer) against a long-answer one (half the prompt, 3x the answer).
MIXES = {"plain": ((1.0, 1.0),), "prompt-answer": ((3.0, 0.5), (0.5, 3.0)), "answer-prompt": ((0.5, 3.0), (3.0, 0.5))}
DEVICES = 16
_COST_FOR = costs_by_degree()


def mean_work_s(lengths: tuple[float, float], draws: int = 2000) -> float:
    """The mean unloaded TP1 latency at 0.9 of a request of these length multipliers: a phase's rate is
    divided by it (relative to the plain trace's), so a load scale offers the same work whatever the mix."""
    prompts, outputs = preset_lengths("sharegpt", draws, np.random.default_rng(12345))
    ppf = positions_per_forward(POSITIONS_PER_FORWARD[MODEL], 0.9)
    total = 0.0
    for p, o in zip(prompts.tolist(), outputs.tolist()):
        p, o = fit_lengths(max(1, round(p * lengths[0])), max(1, round(o * lengths[1])), MODELS[MODEL].max_len)
        total += unloaded_latency_s(_COST_FOR(1), p, o, BLOCK, ppf)
    return total / draws


def scenario_trace(sc: dict, seed: int):
    """(requests with SLOs, each one's phase, the phases (s, req/s)) of a scenario."""
    mix = MIXES[sc["mix"]]
    lengths = [mix[k % len(mix)] for k in range(len(sc["loads"]))]
    plain = mean_work_s((1.0, 1.0))
    phases = [(sc["phase_s"], REFERENCE_RATE * s * plain / mean_work_s(lengths[k]))
              for k, s in enumerate(sc["loads"])]
    rows = burst_rows(phases, sc["shape"], seed, max_len=MODELS[MODEL].max_len, phase_lengths=lengths)
    with tempfile.TemporaryDirectory() as tmp:
        requests = trace_workload(write_jsonl(rows, Path(tmp) / "burst.jsonl"))
    ppf = positions_per_forward(POSITIONS_PER_FORWARD[MODEL], 0.95)
    slos = [sc["slo_k"] * unloaded_latency_s(_COST_FOR(4), r.prompt_len, r.max_tokens, BLOCK, ppf) for r in requests]
    return with_slos(requests, slos), [r["phase"] for r in rows], phases


def job(args) -> dict:
    """One run: a static layout (start d, reconfigure False) or the planner starting as devices // d x TPd."""
    sc, seed, d, reconfigure, restart_s, period_s = args
    torch.set_num_threads(1)
    requests, phase_of, phases = scenario_trace(sc, seed)
    config = base_config(reconfigure_period_s=period_s, reconfigure_restart_s=restart_s,
                         reconfigure_planner="attainment")
    res, rc, cpu = run(requests, layout_degrees({d: DEVICES // d}), _COST_FOR, config, seed, reconfigure, restart_s)
    return {"scenario": sc, "seed": seed, "degree": d, "reconfigure": reconfigure, "cpu_s": cpu,
            "metrics": phase_metrics(res, phase_of, len(phases)), "phases": phases, "requests": len(requests),
            "median_slo_s": statistics.median(r.slo_ms for r in requests) / 1e3,
            "regroups": regroups_per_phase(rc, phases),
            "layouts": [(t, layout_name(x)) for t, x in rc.summary()["layouts"]] if rc else []}


def crossing(static: dict[int, dict]) -> dict:
    """Each phase's best layout, the best single layout and the oracle's gain over it (points)."""
    any_run = next(iter(static.values()))
    counts = [p["requests"] for p in any_run["metrics"]["phases"]]
    best_single = max(static, key=lambda d: static[d]["metrics"]["overall"]["attainment"])
    # a phase's best is the best single layout unless another meets more there (ties stay with it)
    per_phase = [max(static, key=lambda d: (static[d]["metrics"]["phases"][k]["attainment"], d == best_single))
                 for k in range(len(counts))]
    oracle = sum(n * static[d]["metrics"]["phases"][k]["attainment"]
                 for k, (n, d) in enumerate(zip(counts, per_phase))) / sum(counts)
    best = static[best_single]["metrics"]["overall"]["attainment"]
    return {"best_single": best_single, "best": best, "per_phase": per_phase, "oracle": oracle,
            "oracle_gain": oracle - best, "changes": len(set(per_phase)) > 1}


def main() -> None:
    ap = parser(__doc__, seed=0, json_out=True)
    ap.add_argument("--slo-k", default="1.0,1.5,3")
    ap.add_argument("--loads", default="0.3:0.9:1.4:0.5,0.15:1.5:0.15:1.5",
                    help="scenarios' phase loads (x the reference rate), phases split by ':'")
    ap.add_argument("--mixes", default="plain,prompt-answer,answer-prompt", help=f"of {sorted(MIXES)}")
    ap.add_argument("--shapes", default="0.5,2", help="Gamma shapes of the gaps (0.5: CV 1.41, 2: CV 0.71)")
    ap.add_argument("--phase-s", type=float, default=60.0)
    ap.add_argument("--layouts", default="1,2,4", help="static layouts, devices // d x TPd")
    ap.add_argument("--start", type=int, default=2, help="the reconfiguring run's first layout")
    ap.add_argument("--min-oracle", type=float, default=1.0, help="reconfigure where the oracle gains this (points)")
    ap.add_argument("--restart-s", type=float, default=ASSUMED_RESTART_S)
    ap.add_argument("--period-s", type=float, default=30.0)
    ap.add_argument("--jobs", type=int, default=2, help="simulations run at once (one core each)")
    ap.add_argument("--baseline", help="an earlier sweep's JSON with the same arguments: its static runs are reused")
    a = ap.parse_args()
    if unknown := set(a.mixes.split(",")) - set(MIXES):
        ap.error(f"--mixes: unknown {sorted(unknown)}")
    scenarios = [{"slo_k": float(k), "loads": [float(x) for x in loads.split(":")], "mix": mix,
                  "shape": float(shape), "phase_s": a.phase_s}
                 for k in a.slo_k.split(",") for loads in a.loads.split(",") for mix in a.mixes.split(",")
                 for shape in a.shapes.split(",")]
    layouts = [int(d) for d in a.layouts.split(",")]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as pool:
        if a.baseline:       # a planner change leaves the static runs as they were
            static = [r for r in read_json(a.baseline)["static"]
                      if r["scenario"] in scenarios and r["seed"] == a.seed and r["degree"] in layouts]
            if len(static) != len(scenarios) * len(layouts):
                ap.error(f"--baseline {a.baseline}: {len(static)} of the {len(scenarios) * len(layouts)} static runs "
                         "these arguments need")
        else:
            static = list(pool.map(job, [(sc, a.seed, d, False, a.restart_s, a.period_s)
                                         for sc in scenarios for d in layouts]))
        cells = [({r["degree"]: r for r in static if r["scenario"] == sc}) for sc in scenarios]
        verdicts = [crossing(c) for c in cells]
        todo = [sc for sc, v in zip(scenarios, verdicts) if v["changes"] and 100 * v["oracle_gain"] >= a.min_oracle]
        reconf = list(pool.map(job, [(sc, a.seed, a.start, True, a.restart_s, a.period_s) for sc in todo]))
    print(f"SIMULATED (roofline cost model, parametric behaviour, today's curve; no GPU ran): {MODEL} on {DEVICES} x "
          f"h100, the BurstGPT-like trace (loadgen/burst.py), {a.phase_s:g}-s phases at the given loads x "
          f"{REFERENCE_RATE} req/s, each phase's rate divided by its mix's mean unloaded TP1 work (so a load offers "
          f"the same work whatever the mix; mixes per phase prompt x, answer x: "
          + "; ".join(f"{m} {' / '.join(f'{p:g}, {o:g}' for p, o in MIXES[m])}" for m in a.mixes.split(","))
          + f"); SLO = k x unloaded TP4 latency at 0.95; the slo policy with load control and deadline scheduling, "
          f"routing completion; reconfiguration: the attainment planner every {a.period_s:g} s from "
          f"{layout_name(layout_degrees({a.start: DEVICES // a.start}))}, ASSUMED restart {a.restart_s:g} s; seed "
          f"{a.seed}; {len(reconf) + (0 if a.baseline else len(static))} runs"
          + (f" (the static ones read from {a.baseline})" if a.baseline else "")
          + f", {time.perf_counter() - t0:.0f} s wall\n")
    table = Table(["SLO k", "loads", "mix", "shape", "median SLO (s)",
                   *(layout_name(layout_degrees({d: DEVICES // d})) for d in layouts), "each phase's best",
                   "oracle - best", "reconfiguration", "- best static", "worst phase - best static's", "regroups",
                   "threshold best / reconf."])
    out = []
    for sc, cell, v in zip(scenarios, cells, verdicts):
        r = next((x for x in reconf if x["scenario"] == sc), None)
        best = cell[v["best_single"]]["metrics"]
        row = {"scenario": sc, **v, "reconfiguration": r}
        out.append(row)
        rec = worst = regroups = thr = "-"
        if r:
            m = r["metrics"]
            rec = f"{100 * m['overall']['attainment']:.1f} %"
            row["gain"] = m["overall"]["attainment"] - v["best"]
            row["worst_phase"] = min(p["attainment"] - q["attainment"] for p, q in zip(m["phases"], best["phases"]))
            worst, regroups = f"{100 * row['worst_phase']:+.1f}", sum(r["regroups"])
            thr = f"{best['overall']['mean_threshold']:.3f} / {m['overall']['mean_threshold']:.3f}"
        table.row(f"{sc['slo_k']:g}", ":".join(f"{x:g}" for x in sc["loads"]), sc["mix"], f"{sc['shape']:g}",
                  f"{cell[layouts[0]]['median_slo_s']:.2f}",
                  *(f"{100 * cell[d]['metrics']['overall']['attainment']:.1f} %" for d in layouts),
                  " / ".join(f"TP{d}" for d in v["per_phase"]), f"{100 * v['oracle_gain']:+.1f}", rec,
                  f"{100 * row['gain']:+.1f}" if r else "-", worst, regroups, thr)
    changing = [x for x in out if x["changes"]]
    print(f"\nthe best static layout changes between phases in {len(changing)} of {len(out)} scenarios; the oracle "
          f"gains >= 3 points in {sum(x['oracle_gain'] >= 0.03 for x in out)} (largest "
          f"{100 * max(x['oracle_gain'] for x in out):+.1f}); reconfiguration run in {len(reconf)}: >= best static "
          f"+ 3 in {sum(x.get('gain', -1) >= 0.03 for x in out)}, >= best static - 1 in "
          f"{sum(x.get('gain', -1) >= -0.01 for x in out)}")
    for x in out:
        if x["reconfiguration"]:
            print(f"  k {x['scenario']['slo_k']:g} {x['scenario']['mix']} shape {x['scenario']['shape']:g} "
                  f"loads {x['scenario']['loads']}: layouts "
                  + ", ".join(f"{t:.0f} s {name}" for t, name in x["reconfiguration"]["layouts"]))
    if a.json:
        write_json(a.json, {"simulated": True, "args": vars(a), "static": static, "scenarios": out})


if __name__ == "__main__":
    main()
