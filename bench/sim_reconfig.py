"""SIMULATED: static layouts against reconfiguration (--planner attainment or ilp) on 16 H100-class devices,
LLaDA-8B, under the trace, SLOs and policy of bench/sim_reconfig_static.py; per load phase: SLO attainment,
threshold, p99.

    python -m bench.sim_reconfig [--slo-k 3] [--phase-s 120] [--period-s 30] [--json out.json]
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import Table, parser, write_json
from bench.sim_reconfig_static import BLOCK, LADDER, base_config, build_sim, phase_metrics
from dllm_server.costmodel.gpu import MODELS, gpu_cost
from dllm_server.sim.behaviour import POSITIONS_PER_FORWARD, positions_per_forward
from dllm_server.sim.instances import layout_degrees, layout_name, unloaded_latency_s, with_slos
from dllm_server.sim.regroup import ASSUMED_RESTART_S, reconfigurer
from dllm_server.sim.workload import trace_workload
from loadgen.burst import burst_rows, scaled_phases, write_jsonl

# The reconfiguring run starts as 8 x TP2 (no prior knowledge of the load) and runs the server's own
# planner and regroup driver on the virtual clock (sim/regroup.py), only the forward and transport
# simulated. Assumed, printed with the figures: the roofline TP cost model and a regrouped
# instance's restart (--restart-s, default sim/regroup.py ASSUMED_RESTART_S).
MODEL = "llada-8b"
REFERENCE_RATE = 8.50    # 16 x TP1's simulated capacity at fixed 0.9 (bench/sim_reconfig_static.py reference_capacity)


def costs_by_degree():
    """cost_for(d): the roofline H100 cost of a TP-d instance, each built once (`cost_for.cache`)."""
    cache: dict = {}

    def cost_for(d: int):
        if d not in cache:
            cache[d] = gpu_cost(MODEL, "h100", block_length=BLOCK, tp=d)
        return cache[d]
    cost_for.cache = cache
    return cost_for


def burst_requests(devices_ref: float, scales, phase_s: float, shape: float, slo_k: float, cost_tp4, seed: int):
    """The trace's requests with their SLOs (k x the unloaded TP4 latency at 0.95), and each one's phase."""
    phases = scaled_phases(devices_ref, scales, phase_s)
    rows = burst_rows(phases, shape, seed, max_len=MODELS[MODEL].max_len)
    with tempfile.TemporaryDirectory() as tmp:      # through the replay path a user's trace takes
        requests = trace_workload(write_jsonl(rows, Path(tmp) / "burst.jsonl"))
    ppf = positions_per_forward(POSITIONS_PER_FORWARD[MODEL], 0.95)
    requests = with_slos(requests, [slo_k * unloaded_latency_s(cost_tp4, r.prompt_len, r.max_tokens, BLOCK, ppf)
                                    for r in requests])
    return requests, phases, [r["phase"] for r in rows]


def run(requests, degrees, cost_for, config, seed: int, reconfigure: bool, restart_s: float):
    """One run: (SimResult, Reconfigurer or None, CPU seconds)."""
    sim, _ = build_sim(degrees, cost_for, config, MODEL, seed)
    rc = reconfigurer(sim, cost_for, restart_s, (MODELS[MODEL].heads, MODELS[MODEL].kv_heads)) if reconfigure else None
    t0 = time.process_time()
    res = sim.run(requests)
    return res, rc, time.process_time() - t0


def regroups_per_phase(rc, phases) -> list[int]:
    """Regroups that began in each phase (one after the last arrival counts to the last phase)."""
    out = [0] * len(phases)
    for r in (rc.records if rc else ()):
        k, end = 0, phases[0][0]
        while r.began_s >= end and k < len(phases) - 1:
            k += 1
            end += phases[k][0]
        out[k] += 1
    return out


def main() -> None:
    ap = parser(__doc__, seed=0)
    ap.add_argument("--devices", type=int, default=16)
    ap.add_argument("--scales", default="0.3,0.9,1.4,0.5", help="each phase's rate / the reference rate")
    ap.add_argument("--phase-s", type=float, default=120.0, help="seconds per phase")
    ap.add_argument("--period-s", type=float, default=30.0, help="the planner's period (--reconfigure-period-s)")
    ap.add_argument("--restart-s", type=float, default=ASSUMED_RESTART_S, help="a regrouped instance's restart")
    ap.add_argument("--shape", type=float, default=0.5, help="Gamma shape of the gaps (0.5: CV 1.41)")
    ap.add_argument("--slo-k", type=float, default=3.0, help="SLO = k x the unloaded TP4 latency at 0.95")
    ap.add_argument("--reference-rate", type=float, default=REFERENCE_RATE, help="req/s the scales multiply")
    ap.add_argument("--start", type=int, default=2, help="the reconfiguring run's first layout: devices // d x TPd")
    ap.add_argument("--static", default="1,2,4", help="the static layouts run beside it (devices // d x TPd)")
    ap.add_argument("--planner", default="attainment", choices=("attainment", "ilp"), help="--reconfigure-planner")
    ap.add_argument("--json", help="write every figure and planner decision here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cost_for = costs_by_degree()
    costs = cost_for.cache
    scales = [float(s) for s in a.scales.split(",")]
    requests, phases, phase_of = burst_requests(a.reference_rate, scales, a.phase_s, a.shape, a.slo_k, cost_for(4),
                                                a.seed)
    counts = [phase_of.count(k) for k in range(len(phases))]
    config = base_config(reconfigure_period_s=a.period_s, reconfigure_restart_s=a.restart_s,
                         reconfigure_planner=a.planner)
    print(f"SIMULATED (roofline cost model, parametric behaviour; no GPU ran): {MODEL} on {a.devices} x h100, "
          f"BurstGPT-like trace (synthetic, loadgen/burst.py): {len(phases)} phases x {a.phase_s:g} s at "
          f"{', '.join(f'{s:g}x' for s in scales)} of {a.reference_rate:.2f} req/s = "
          f"{', '.join(f'{r:.2f}' for _, r in phases)} req/s, Gamma shape {a.shape:g}, {len(requests)} requests "
          f"({', '.join(map(str, counts))} per phase); SLO = {a.slo_k:g} x unloaded TP4 latency at 0.95 (median "
          f"{statistics.median(r.slo_ms for r in requests) / 1e3:.2f} s); threshold_policy slo, ladder {LADDER}, "
          f"floor 0.7, load control on, routing completion, tau 1024, block {BLOCK}, seed {a.seed}. Reconfiguration: "
          f"starts as {layout_name(layout_degrees({a.start: a.devices // a.start}))}, {a.planner} planner every "
          f"{a.period_s:g} s "
          f"(min gain {config.reconfigure_min_gain:g}, waves of <= {config.reconfigure_wave_share:g} of the devices, "
          f"prior serial share {config.reconfigure_prior_serial_share:g}), ASSUMED restart {a.restart_s:g} s per "
          f"regrouped instance\n")
    runs = [(layout_name(layout_degrees({d: a.devices // d})), layout_degrees({d: a.devices // d}), False)
            for d in (int(x) for x in a.static.split(",") if x)]
    runs.append((f"{a.planner} reconfiguration", layout_degrees({a.start: a.devices // a.start}), True))
    out = []
    for name, degrees, reconf in runs:
        res, rc, cpu = run(requests, degrees, cost_for, config, a.seed, reconf, a.restart_s)
        m = phase_metrics(res, phase_of, len(phases))
        out.append({"layout": name, "metrics": m, "summary": res.summary(), "cpu_s": cpu,
                    "regroups": regroups_per_phase(rc, phases),
                    "reconfig": rc.summary() if rc else None,
                    "records": [vars(r) for r in rc.records] if rc else [],
                    "decisions": rc.decisions if rc else []})
        print(f"  {name}: {cpu:.0f} s CPU, {res.summary()['completed']}/{len(requests)} completed", file=sys.stderr)
    for k in [*range(len(phases)), None]:
        title = "overall" if k is None else f"phase {k + 1} ({scales[k]:g}x, {phases[k][1]:.2f} req/s)"
        table = Table(["layout", "SLO attainment", ("mean threshold", ".3f"), ("p99 (s)", ".2f"), "regroups"],
                      f"\n{title} (SIMULATED)\n")
        for r in out:
            p = r["metrics"]["overall"] if k is None else r["metrics"]["phases"][k]
            n = sum(r["regroups"]) if k is None else r["regroups"][k]
            table.row(r["layout"], f"{100 * p['attainment']:.1f} %", p["mean_threshold"], p["p99_s"], n)
    rc = out[-1]
    print("\nreconfiguration: layouts (since s: degrees) " + ", ".join(
        f"{t:.0f}: {layout_name(d)}" for t, d in rc["reconfig"]["layouts"])
        + "; longest drain per regroup "
        + ", ".join(f"{max(x['drain_s'].values(), default=0):.2f}" for x in rc["records"])
        + " s; waves " + ", ".join(str(x.get("waves", 1)) for x in rc["records"])
        + "; most devices out at once " + ", ".join(str(x.get("peak_out_devices", 0)) for x in rc["records"])
        + f"; "
        f"GPU-s draining {rc['reconfig']['drain_gpu_s']:.0f}, idle {rc['reconfig']['idle_gpu_s']:.0f}; blocks evicted "
        f"{rc['reconfig']['blocks_evicted']}; planner decisions {rc['reconfig']['decisions']}")
    for t, d in rc["decisions"]:
        print(f"  t={t:.0f} s: rate {d.get('rate', 0):.2f}/s, {d.get('current')} -> {d.get('target')}: "
              f"{'REGROUP' if d.get('regroup') else 'keep'} ({d.get('why')})")
    print("\ncost model (costmodel/gpu.py describe(), TP4):\n" + json.dumps(cost_for(4).describe(), default=str))
    if a.json:
        write_json(a.json, {"simulated": True, "args": vars(a), "phases": phases, "runs": out,
                            "assumptions": {str(d): c.describe() for d, c in sorted(costs.items())}})


if __name__ == "__main__":
    main()
