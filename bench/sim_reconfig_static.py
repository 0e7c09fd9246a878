"""SIMULATED static layouts under a bursty trace, the baseline of reconfiguration: 16 H100-class GPUs as
16 x TP1, 8 x TP2 and 4 x TP4 serving LLaDA-8B with the SLO policy; SLO attainment overall and per phase.

    python -m bench.sim_reconfig_static [--phase-s 60] [--slo-k 1.5] [--shape 0.5] [--fixed 0.7,0.9] [--json out.json]
"""
from __future__ import annotations

import dataclasses

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import Table, parser, write_json
from dllm_server.config import ServerConfig
from dllm_server.costmodel.gpu import MODELS, gpu_cost
from dllm_server.policy.load_control import LoadController
from dllm_server.sim.behaviour import POSITIONS_PER_FORWARD, ParametricBehaviour, positions_per_forward
from dllm_server.sim.cluster import Simulator
from dllm_server.sim.instances import layout_degrees, layout_name, unloaded_latency_s, with_slos
from dllm_server.sim.regroup import layout_simulator
from dllm_server.sim.workload import preset_workload, rescale, trace_workload
from loadgen.burst import burst_rows, scaled_phases, write_jsonl
from loadgen.capacity import find_capacity_sync

# The trace: loadgen/burst.py's BurstGPT-like phases (0.3x, 0.9x, 1.4x and 0.5x of the reference
# rate, Gamma gaps of shape 0.5, ShareGPT-like lengths); every run threshold_policy="slo" (the
# ladder, floor 0.7), load control on, routing by predicted completion; each request's SLO is k x
# its unloaded latency on one TP4 instance at threshold 0.95. The reference rate is 16 x TP1's
# simulated capacity at fixed 0.9 (reference_capacity), or --reference-rate to replay one trace.
LADDER = "0.95,0.9,0.8,0.7"      # positions per forward are flat below 0.7 in the simulator (sim/behaviour.py)
BLOCK = 32


class RecordingController(LoadController):
    """Load control as the SLO policy runs it, noting each cap it sets (time, cap)."""
    __slots__ = ("log", "clock")

    def update(self, demand, capacity) -> float:
        before = self.cap
        cap = super().update(demand, capacity)
        if cap != before:
            self.log.append((self.clock(), cap))
        return cap


def reference_capacity(cost_tp1, devices: int, tau: float = 0.9, knee: float = 4.0, requests: int = 400,
                       tolerance: float = 0.1, seed: int = 0) -> tuple[float, dict]:
    """`devices` x TP1's capacity at fixed tau, simulated with docs/simulation.md's convention (its
    experiments A-D): the highest Poisson rate whose p90 end-to-end latency stays within `knee` x
    the mean unloaded latency (here sim/instances.py's estimate, within a few % of a lone request's
    simulated latency), found by loadgen's capacity search over `requests` ShareGPT-like requests
    rescaled per probe. Not the per-request SLO of the runs: at a tight one a TP1 instance meets few
    SLOs at any load."""
    shape = MODELS["llada-8b"]
    reqs = preset_workload("sharegpt", requests, 1.0, seed + 1, max_len=shape.max_len)
    ppf = positions_per_forward(POSITIONS_PER_FORWARD["llada-8b"], tau)
    bound = knee * statistics.mean(unloaded_latency_s(cost_tp1, r.prompt_len, r.max_tokens, BLOCK, ppf) for r in reqs)
    config = base_config(threshold_policy="fixed", threshold=tau, num_workers=devices)

    def measure(rate: float) -> dict:
        sim = Simulator(config, None, ParametricBehaviour("llada-8b", seed), shape.model_info(),
                        costs=[cost_tp1] * devices)
        return sim.run(rescale(reqs, rate)).summary()
    found = find_capacity_sync(measure, lambda s: s["unfinished"] == 0 and s["p90_s"] <= bound,
                               start_rate=devices / 2.0, tolerance=tolerance, max_steps=12)
    return found["capacity"] or 0.0, {
        "how": f"p90 <= {knee:g} x mean unloaded latency ({bound:.2f} s), {requests} Poisson requests per probe, "
               f"fixed {tau}, {devices} x TP1", "probes": [(h["rate"], h["ok"]) for h in found["history"]]}


def base_config(**over) -> ServerConfig:
    # threshold 0.9: the server's default; the policy goes above it only with slack (policy/thresholds.py)
    return ServerConfig(**{**dict(block_length=BLOCK, threshold=0.9, threshold_policy="slo", slo_thresholds=LADDER,
                                  quality_floor=0.7, load_control=True, routing="completion", token_budget=1024,
                                  max_waiting_requests=1 << 20), **over})


def run_layout(requests, degrees, cost_for, config: ServerConfig, model: str = "llada-8b", seed: int = 0,
               curve: str = "dilaserve"):
    """One static layout: each instance one simulated worker with its own cost and pool (the
    SLO policy's step-time models seeded from each one's profile). Returns (SimResult, the
    cap changes load control made)."""
    sim, log = build_sim(degrees, cost_for, config, model, seed, curve)
    return sim.run(requests), log


def build_sim(degrees, cost_for, config: ServerConfig, model: str = "llada-8b", seed: int = 0,
              curve: str = "dilaserve"):
    """The Simulator of a layout (not run yet; a reconfiguring run attaches its Reconfigurer) and
    the list load control's cap changes will be noted in."""
    sim = layout_simulator(degrees, cost_for, config, model, seed, curve)
    policy = sim.scheduler.policy
    log: list = []
    if getattr(policy, "controller", None) is not None:
        c = policy.controller      # every setting carried over, not only the two the constructor needs
        rec = RecordingController(**{f.name: getattr(c, f.name) for f in dataclasses.fields(c)})
        rec.log, rec.clock = log, sim.clock
        policy.controller = rec
    return sim, log


def phase_metrics(result, phases: list[int], num_phases: int) -> dict:
    """SLO attainment, mean block threshold and p99 latency, overall and per phase (of arrival)."""
    def pick(sel):
        rs = [r for r in result.requests if sel(r)]
        done = [r for r in rs if r.finish_reason in ("stop", "length")]
        lat = sorted(r.latency_s for r in done)
        taus = [t for r in done for t in r.thresholds]
        return {"requests": len(rs), "attainment": sum(bool(r.slo_met) for r in rs) / len(rs) if rs else float("nan"),
                "mean_threshold": statistics.mean(taus) if taus else float("nan"),
                "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")}
    return {"overall": pick(lambda r: True),
            "phases": [pick(lambda r, k=k: phases[r.seq] == k) for k in range(num_phases)]}


def main() -> None:
    ap = parser(__doc__, seed=0)
    ap.add_argument("--devices", type=int, default=16)
    ap.add_argument("--layouts", default="1,2,4", help="degrees: one static layout of devices // d x TPd each")
    ap.add_argument("--device", default="h100", choices=("h100", "h200"))
    ap.add_argument("--scales", default="0.3,0.9,1.4,0.5", help="each phase's rate / the reference capacity")
    ap.add_argument("--phase-s", type=float, default=60.0, help="seconds per phase")
    ap.add_argument("--shape", type=float, default=0.5, help="Gamma shape of the gaps (0.5: CV 1.41; 0.25: CV 2)")
    ap.add_argument("--slo-k", type=float, default=1.5, help="SLO = k x the unloaded TP4 latency at 0.95")
    ap.add_argument("--reference-rate", type=float, help="req/s the scales multiply (default: devices x TP1's "
                    "simulated capacity at fixed 0.9, reference_capacity)")
    ap.add_argument("--predictor", default=None, help="step predictor artefact for the SLO policy (default: the "
                    "SimpleEstimator, the fallback a checkpoint without one gets)")
    ap.add_argument("--fixed", default="", help="also run each layout at these fixed thresholds (controls), e.g. 0.7")
    ap.add_argument("--orders", default="fcfs", help="scheduling policies to run every configuration under "
                    "(fcfs, deadline: --scheduling-policy)")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, table = "llada-8b", POSITIONS_PER_FORWARD["llada-8b"]
    costs = {}

    def cost_for(d: int):
        if d not in costs:
            costs[d] = gpu_cost(model, a.device, block_length=BLOCK, tp=d)
        return costs[d]
    scales = [float(s) for s in a.scales.split(",")]
    # the reference rate is found on a Poisson draw of the same lengths (the rate must be known before
    # the trace's arrivals are drawn)
    ppf95 = positions_per_forward(table, 0.95)
    ref_info: dict = {"given": a.reference_rate}
    ref = a.reference_rate
    if ref is None:
        t0 = time.process_time()
        ref, ref_info = reference_capacity(cost_for(1), a.devices, 0.9, seed=a.seed)
        ref_info["cpu_s"] = time.process_time() - t0
        print(f"  reference: {ref:.2f} req/s ({ref_info['how']}), {ref_info['cpu_s']:.0f} s CPU", file=sys.stderr)
    if not ref > 0:
        raise SystemExit(f"{a.devices} x TP1 sustains no probed rate: give --reference-rate")
    phases = scaled_phases(ref, scales, a.phase_s)
    rows = burst_rows(phases, a.shape, a.seed, max_len=MODELS[model].max_len)
    with tempfile.TemporaryDirectory() as tmp:      # through the replay path a user's trace takes
        path = write_jsonl(rows, Path(tmp) / "burst.jsonl")
        requests = trace_workload(path)
    requests = with_slos(requests, [a.slo_k * unloaded_latency_s(cost_for(4), r.prompt_len, r.max_tokens, BLOCK, ppf95)
                                    for r in requests])
    phase_of = [r["phase"] for r in rows]
    counts = [phase_of.count(k) for k in range(len(phases))]
    print(f"SIMULATED (roofline cost model, parametric behaviour; no GPU ran): {model} on {a.devices} x {a.device}, "
          f"BurstGPT-like trace (synthetic, loadgen/burst.py): {len(phases)} phases x {a.phase_s:g} s at "
          f"{', '.join(f'{s:g}x' for s in scales)} of {ref:.2f} req/s ({a.devices} x TP1's simulated capacity "
          f"at fixed 0.9, p90 <= 4 x unloaded mean) = {', '.join(f'{r:.2f}' for _, r in phases)} req/s, "
          f"Gamma shape {a.shape:g}, "
          f"{len(requests)} requests ({', '.join(map(str, counts))} per phase), ShareGPT preset lengths, each asks "
          f"exactly its output length; SLO per request = {a.slo_k:g} x its unloaded latency on one TP4 at 0.95 "
          f"(median {statistics.median(r.slo_ms for r in requests) / 1e3:.2f} s); threshold_policy slo, ladder "
          f"{LADDER}, floor 0.7, load control on (target {base_config().load_target}), routing completion, "
          f"tau 1024, block {BLOCK}, step predictor {a.predictor or 'SimpleEstimator'}, server threshold 0.9, "
          f"seed {a.seed}\n")
    names = [f"phase {k + 1} ({s:g}x)" for k, s in enumerate(scales)]
    table = Table(["layout (SIMULATED)", "KV pool per instance (tokens)", "SLO attainment", *names,
                   ("mean block threshold", ".3f"), "per phase", ("p99 (s)", ".2f"), "completed",
                   "load-control cap changes", ("CPU (s)", ".0f")])
    out = []
    runs = [(d, None) for d in (int(x) for x in a.layouts.split(","))]
    runs += [(d, float(f)) for f in a.fixed.split(",") if f.strip() for d, _ in list(runs)]
    runs = [(d, f, o) for o in a.orders.split(",") for d, f in runs]
    for d, fixed, order in runs:
        degrees = layout_degrees({d: a.devices // d})
        config = base_config(step_predictor=a.predictor, scheduling_policy=order) if fixed is None else \
            base_config(threshold_policy="fixed", threshold=fixed, scheduling_policy=order)
        name = layout_name(degrees) + ("" if fixed is None else f", fixed {fixed:g}") + \
            ("" if order == "fcfs" else f", {order}")
        t0 = time.process_time()
        res, caps = run_layout(requests, degrees, cost_for, config, model, a.seed)
        cpu = time.process_time() - t0
        m = phase_metrics(res, phase_of, len(phases))
        s = res.summary()
        out.append({"layout": name, "degree": d, "fixed": fixed, "order": order, "metrics": m, "summary": s, "cap_changes": caps,
                    "cpu_s": cpu, "kv_pool_tokens": cost_for(d).kv_pool_tokens()})
        o = m["overall"]
        control = "-" if fixed is not None else f"{len(caps)}, lowest {min((c for _, c in caps), default=0.95):.2f}"
        table.row(name, f"{cost_for(d).kv_pool_tokens() // 1000}k", f"{100 * o['attainment']:.1f} %",
                  *(f"{100 * p['attainment']:.1f} %" for p in m["phases"]), o["mean_threshold"],
                  " / ".join(f"{p['mean_threshold']:.2f}" for p in m["phases"]), o["p99_s"],
                  f"{s['completed']}/{s['requests']}", control, cpu)
        print(f"  {name}: {cpu:.0f} s CPU", file=sys.stderr)
    assumptions = {str(d): c.describe() for d, c in sorted(costs.items())}
    print("\ncost model (costmodel/gpu.py describe(), TP4 shown; TP1/TP2 differ only in tensor_parallel_size and "
          "kv_pool_tokens):\n" + json.dumps(assumptions["4"], indent=1, default=str))
    if a.json:
        write_json(a.json, {"simulated": True, "args": vars(a), "reference_rate": ref, "reference": ref_info,
                            "phases": phases, "runs": out, "assumptions": assumptions})


if __name__ == "__main__":
    main()
