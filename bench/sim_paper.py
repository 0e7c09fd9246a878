"""The Sangam paper's GPU experiments, SIMULATED (docs/simulation.md; nothing ran on a GPU): A capacity at
matched latency, B the token-budget sweep, C placements, D block length, on 8 simulated H100s.

    python -m bench.sim_paper [--only A,B,C,D] [--requests 500] [--jobs 1] [--out docs/results/sim_paper.json]
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.harness import Table, Timer, parser, write_json
from dllm_server.sizing import build_setup, capacity, simulate

# Our scheduler and worker code on a virtual clock; iteration times from the GPU roofline cost
# model (costmodel/gpu.py, every constant cited or an assumption), forwards per block from the
# parametric behaviour model (sim/behaviour.py).

JOBS = 1
SAVE = None                  # the results file, for experiments that save row by row


def pmap(calls: list[tuple]) -> list:
    """[(fn, *args)] -> results, in JOBS processes (the runs are independent)."""
    if JOBS <= 1:
        return [c[0](*c[1:]) for c in calls]
    with ProcessPoolExecutor(JOBS, mp_context=multiprocessing.get_context("spawn")) as ex:
        return list(ex.map(_call, calls))


def _call(c: tuple):
    return c[0](*c[1:])

MIXES = {   # name -> (model, loadgen preset); lengths fitted to a 4096-token context (Sangam's arXiv recipe)
    "decode-heavy (LLaDA-8B, ShareGPT)": ("llada-8b", "sharegpt"),
    "prefill-heavy (Dream-7B, arXiv)": ("dream-7b", "arxiv"),
}
BASELINE = dict(max_active_decodes=1, token_budget=None)
COLOCATED = dict(placement="colocated", num_workers=8, token_budget=1024)
PLACEMENTS = {"colocated x8": COLOCATED,
              "5P3D (disaggregated)": dict(placement="disaggregated", num_workers=3, num_prefill_workers=5,
                                           token_budget=1024),
              "5P3C (hybrid, theta=8192)": dict(placement="hybrid", num_workers=3, num_prefill_workers=5,
                                               overflow_threshold_tokens=8192, token_budget=1024)}
TAUS = (256, 1024, 4096, 16384, None)


def setup_for(mix: str, n: int, device: str = "h100", block_length: int = 32, max_tokens=None, slo_s: float = 1.0,
              eff=None):
    model, preset = MIXES[mix]
    s = build_setup(model, device, preset, None, n, "p90", slo_s, block_length=block_length, max_tokens=max_tokens)
    s.base = s.base.replace(num_workers=8)
    if eff is not None:
        s.cost = dataclasses.replace(s.cost, eff=eff)
    return s


def slo_from_baseline(s) -> float:
    """The SLO of gpu_capacity.py: e2e within 4x the batch-1 baseline's unloaded latency (p90)."""
    unloaded = simulate(s, {**COLOCATED, **BASELINE}, 0.05)["mean_s"]
    return 4 * unloaded


def fmt(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"


def exp_a(n: int, out: dict) -> None:
    mix = next(iter(MIXES))
    print(f"\n### A. capacity at matched latency, 8 workers, {mix} (simulated)\n")
    table = Table(["host term", "device", ("SLO p90 (s)", ".2f"), ("batch-1 baseline (req/s)", ".2f"),
                   ("colocated tau=1024 (req/s)", ".2f"), "ratio"])
    setups = []
    for device in ("h100", "h200"):
        for label in ("as assumed (1 ms + 60 us/row)", "dispatch-bound (76 % of batch-1 time)"):
            s = setup_for(mix, n, device)
            if label.startswith("dispatch"):
                from dllm_server.costmodel.iteration import IterationStats as _It
                fwd = s.cost.forward_s(_It(decode_tokens=32, decode_keys=1100, num_decodes=1))
                s.cost = dataclasses.replace(s.cost, eff=dataclasses.replace(
                    s.cost.eff, host_base_s=fwd * 0.76 / 0.24, host_per_row_s=0.0,
                    source="host = 76 % of batch-1 time (dilaserve_eval_ray.md 2.2, item 5)"))
            setups.append((device, label, s))
    slos = pmap([(slo_from_baseline, s) for _, _, s in setups])
    for (_, _, s), slo in zip(setups, slos):
        s.slo_s = slo
    caps = pmap([c for _, _, s in setups for c in ((capacity, s, {**COLOCATED, **BASELINE}, 1.0, 0.05),
                                                      (capacity, s, COLOCATED, 4.0, 0.05))])
    res = []
    for k, (device, label, s) in enumerate(setups):
        base, ours = caps[2 * k], caps[2 * k + 1]
        ratio = ours["capacity_req_s"] / base["capacity_req_s"] if base["capacity_req_s"] else None
        table.row(label, device, s.slo_s, base["capacity_req_s"], ours["capacity_req_s"], f"**{fmt(ratio)}x**")
        res.append({"device": device, "host": label, "slo_p90_s": s.slo_s, "baseline": base, "colocated": ours,
                    "ratio": ratio, "cost": s.cost.describe()})
    out["A"] = res


def exp_b(n: int, out: dict, load: float = 0.8) -> None:
    print(f"\n### B. token-budget sweep, 8 colocated workers, H100, at {load:.0%} of the tau=1024 capacity "
          "(simulated)\n")
    out["B"] = {}
    for mix in MIXES:
        s = setup_for(mix, n)
        s.slo_s = slo_from_baseline(s)
        cap = capacity(s, COLOCATED, start_rate=4.0, tolerance=0.05)["capacity_req_s"]
        rate = load * cap
        print(f"\n{mix}: tau=1024 capacity {cap:.2f} req/s (SLO p90 <= {s.slo_s:.2f} s); Poisson {rate:.2f} req/s, "
              f"{n} requests\n")
        table = Table(["tau", ("mean (s)", ".2f"), ("p50 (s)", ".2f"), ("p99 (s)", ".2f"), ("req/s", ".2f"),
                       ("output tok/s", ".0f")])
        rows = []
        runs = pmap([(simulate, s, {**COLOCATED, "token_budget": tau}, rate) for tau in TAUS])
        for tau, r in zip(TAUS, runs):
            rows.append({"tau": tau, **r})
            table.row("inf" if tau is None else tau, r["mean_s"], r["p50_s"], r["p99_s"], r["req_s"], r["tok_s"])
        out["B"][mix] = {"rate": rate, "capacity_tau1024": cap, "rows": rows}


def exp_c(n: int, out: dict) -> None:
    print("\n### C. placements on 8 workers, H100, NVLink (simulated)\n")
    out["C"] = {}
    for mix in MIXES:
        s = setup_for(mix, n)
        s.slo_s = slo_from_baseline(s)
        found = pmap([(capacity, s, cfg, 4.0, 0.05) for cfg in PLACEMENTS.values()])
        caps = {name: f["capacity_req_s"] for name, f in zip(PLACEMENTS, found)}
        ref = caps["colocated x8"]
        loads = (0.5, 0.7, 0.9)
        runs = iter(pmap([(simulate, s, cfg, x * ref) for cfg in PLACEMENTS.values() for x in loads]))
        print(f"\n{mix} (SLO p90 <= {s.slo_s:.2f} s; loads as shares of the colocated capacity {ref:.2f} req/s)\n")
        table = Table(["placement", ("capacity (req/s)", ".2f"), *((f"mean at {x:.0%} (s)", ".2f") for x in loads),
                       "vs colocated at 70 %"])
        rows = {}
        for name, cfg in PLACEMENTS.items():
            rows[name] = {"capacity": caps[name], "loads": {x: next(runs) for x in loads}}
        for name, r in rows.items():
            m = [r["loads"][x]["mean_s"] for x in loads]
            rel = m[1] / rows["colocated x8"]["loads"][0.7]["mean_s"] - 1
            table.row(name, r["capacity"], *m, f"{100 * rel:+.0f} %")
        out["C"][mix] = {"slo_p90_s": s.slo_s, "rows": rows}


def exp_d(n: int, out: dict, max_tokens: int = 512) -> None:
    """Block lengths in the order 32, one block per answer, 128, 64, 256 (the ends first), each row
    printed and saved as it finishes."""
    mix = next(iter(MIXES))
    print(f"\n### D. block length: {mix}, answers end at their EOS (max_tokens {max_tokens}), 8 colocated "
          "workers, H100 (simulated)\n")
    table = Table(["block", ("blocks per request", ".1f"), ("capacity tau=1024", ".2f"), ("capacity tau=inf", ".2f"),
                   "tau=1024 / tau=inf", "mean tau=1024 / tau=inf at 80 % of the tau=1024 capacity (s)"])
    s32 = setup_for(mix, n, block_length=32, max_tokens=max_tokens)
    slo = slo_from_baseline(s32)               # one SLO for every block length: the 32-token baseline's
    res = []
    kinds = (("tau=1024", COLOCATED), ("tau=inf", {**COLOCATED, "token_budget": None}))
    for block in (32, max_tokens, 128, 64, 256):
        s = setup_for(mix, n, block_length=block, max_tokens=max_tokens, slo_s=slo)
        found = pmap([(capacity, s, cfg, 4.0, 0.05) for _, cfg in kinds])
        caps = {k: f["capacity_req_s"] for (k, _), f in zip(kinds, found)}
        lat = dict(zip([k for k, _ in kinds], pmap([(simulate, s, cfg, 0.8 * caps["tau=1024"]) for _, cfg in kinds])))
        blocks = sum(-(-(r.eos_at + 1 if r.eos_at is not None else r.max_tokens) // block)
                     for r in s.requests) / len(s.requests)
        ratio = caps["tau=1024"] / caps["tau=inf"] if caps["tau=inf"] else None
        label = f"{block}" + (" (one block per answer)" if block == max_tokens else "")
        table.row(label, blocks, caps["tau=1024"], caps["tau=inf"], fmt(ratio),
                  f"{lat['tau=1024']['mean_s']:.2f} / {lat['tau=inf']['mean_s']:.2f}")
        res.append({"block": block, "blocks_per_request": blocks, "capacity": caps, "at_80": lat, "ratio": ratio})
        out["D"] = {"slo_p90_s": slo, "max_tokens": max_tokens, "requests": n, "rows": res}
        if SAVE is not None:
            write_json(SAVE, out)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--only", default="A,B,C,D")
    ap.add_argument("--requests", type=int, default=500, help="requests per simulated run")
    ap.add_argument("--out", type=Path, default=Path("docs/results/sim_paper.json"))
    ap.add_argument("--jobs", type=int, default=1, help="independent simulations in this many processes")
    a = ap.parse_args()
    global JOBS, SAVE
    JOBS, SAVE = a.jobs, a.out
    only = set(a.only.split(","))
    out = json.loads(a.out.read_text()) if a.out.exists() else {}
    print(f"# The paper's experiments, SIMULATED (cost model: GPU roofline, costmodel/gpu.py; behaviour: parametric, "
          f"3.01 positions per forward at threshold 0.9; {a.requests} requests per run; argv {sys.argv[1:]})")
    with Timer() as clock:
        for key, fn in (("A", exp_a), ("B", exp_b), ("C", exp_c), ("D", exp_d)):
            if key in only:
                fn(a.requests, out)
                write_json(a.out, out)
    print(f"\n(simulated in {clock.s:.0f} s)")


if __name__ == "__main__":
    main()
