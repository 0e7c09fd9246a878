"""The Sangam paper's GPU experiments, SIMULATED (src/dllm_server/sim/, docs/simulation.md): our
scheduler and worker code on a virtual clock, iteration times from the GPU roofline cost model
(costmodel/gpu.py, every constant cited or an assumption), forwards per block from the parametric
behaviour model (sim/behaviour.py). Nothing here ran on a GPU.

  A. capacity: colocated tau=1024 vs the batch-1 baseline, 8 workers, LLaDA-8B, ShareGPT-shaped
     (the paper: ~3.3x on 8 H100s), with the host term as assumed and dispatch-bound;
  B. token-budget sweep at a fixed high load on both mixes;
  C. colocated vs 5P3D vs 5P3C on both mixes (mean latency at three loads, capacity);
  D. block length 32..256 (and one block per answer): how much the deficit budget buys as
     re-prefills become rare.

    python bench/sim_paper.py [--only A,B,C,D] [--requests 500] [--out docs/results/sim_paper.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from dllm_server.sizing import build_setup, capacity, simulate

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
    print("| host term | device | SLO p90 (s) | batch-1 baseline (req/s) | colocated tau=1024 (req/s) | ratio |")
    print("|---|---|---|---|---|---|")
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
        print(f"| {label} | {device} | {s.slo_s:.2f} | {base['capacity_req_s']:.2f} | {ours['capacity_req_s']:.2f} | "
              f"**{fmt(ratio)}x** |", flush=True)
        res.append({"device": device, "host": label, "slo_p90_s": s.slo_s, "baseline": base, "colocated": ours,
                    "ratio": ratio, "cost": s.cost.describe()})
    out["A"] = res


def exp_b(n: int, out: dict, load: float = 0.8) -> None:
    print(f"\n### B. token-budget sweep, 8 colocated workers, H100, at {load:.0%} of the tau=1024 capacity (simulated)\n")
    out["B"] = {}
    for mix in MIXES:
        s = setup_for(mix, n)
        s.slo_s = slo_from_baseline(s)
        cap = capacity(s, COLOCATED, start_rate=4.0, tolerance=0.05)["capacity_req_s"]
        rate = load * cap
        print(f"\n{mix}: tau=1024 capacity {cap:.2f} req/s (SLO p90 <= {s.slo_s:.2f} s); Poisson {rate:.2f} req/s, "
              f"{n} requests\n")
        print("| tau | mean (s) | p50 (s) | p99 (s) | req/s | output tok/s |\n|---|---|---|---|---|---|")
        rows = []
        runs = pmap([(simulate, s, {**COLOCATED, "token_budget": tau}, rate) for tau in TAUS])
        for tau, r in zip(TAUS, runs):
            rows.append({"tau": tau, **r})
            print(f"| {'inf' if tau is None else tau} | {r['mean_s']:.2f} | {r['p50_s']:.2f} | {r['p99_s']:.2f} | "
                  f"{r['req_s']:.2f} | {r['tok_s']:.0f} |", flush=True)
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
        print("| placement | capacity (req/s) | " + " | ".join(f"mean at {x:.0%} (s)" for x in loads) +
              " | vs colocated at 70 % |")
        print("|---|---|" + "---|" * len(loads) + "---|")
        rows = {}
        for name, cfg in PLACEMENTS.items():
            rows[name] = {"capacity": caps[name], "loads": {x: next(runs) for x in loads}}
        for name, r in rows.items():
            m = [r["loads"][x]["mean_s"] for x in loads]
            rel = m[1] / rows["colocated x8"]["loads"][0.7]["mean_s"] - 1
            print(f"| {name} | {r['capacity']:.2f} | " + " | ".join(f"{v:.2f}" for v in m) + f" | {100 * rel:+.0f} % |",
                  flush=True)
        out["C"][mix] = {"slo_p90_s": s.slo_s, "rows": rows}


def exp_d(n: int, out: dict, max_tokens: int = 512) -> None:
    """Block lengths in the order 32, one block per answer, 128, 64, 256 (the ends first), each row
    printed and saved as it finishes."""
    mix = next(iter(MIXES))
    print(f"\n### D. block length: {mix}, answers end at their EOS (max_tokens {max_tokens}), 8 colocated "
          "workers, H100 (simulated)\n")
    print("| block | blocks per request | capacity tau=1024 | capacity tau=inf | "
          "tau=1024 / tau=inf | mean tau=1024 / tau=inf at 80 % of the tau=1024 capacity (s) |")
    print("|---|---|---|---|---|---|")
    s32 = setup_for(mix, n, block_length=32, max_tokens=max_tokens)
    slo = slo_from_baseline(s32)               # one SLO for every block length: the 32-token baseline's
    res = []
    kinds = (("tau=1024", COLOCATED), ("tau=inf", {**COLOCATED, "token_budget": None}))
    for block in (32, max_tokens, 128, 64, 256):
        s = setup_for(mix, n, block_length=block, max_tokens=max_tokens, slo_s=slo)
        found = pmap([(capacity, s, cfg, 4.0, 0.05) for _, cfg in kinds])
        caps = {k: f["capacity_req_s"] for (k, _), f in zip(kinds, found)}
        lat = dict(zip([k for k, _ in kinds], pmap([(simulate, s, cfg, 0.8 * caps["tau=1024"]) for _, cfg in kinds])))
        blocks = sum(-(-(r.eos_at + 1 if r.eos_at is not None else r.max_tokens) // block) for r in s.requests) / len(s.requests)
        ratio = caps["tau=1024"] / caps["tau=inf"] if caps["tau=inf"] else None
        label = f"{block}" + (" (one block per answer)" if block == max_tokens else "")
        print(f"| {label} | {blocks:.1f} | {caps['tau=1024']:.2f} | {caps['tau=inf']:.2f} | "
              f"{fmt(ratio)} | {lat['tau=1024']['mean_s']:.2f} / {lat['tau=inf']['mean_s']:.2f} |", flush=True)
        res.append({"block": block, "blocks_per_request": blocks, "capacity": caps, "at_80": lat, "ratio": ratio})
        out["D"] = {"slo_p90_s": slo, "max_tokens": max_tokens, "requests": n, "rows": res}
        if SAVE is not None:
            SAVE.write_text(json.dumps(out, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="A,B,C,D")
    ap.add_argument("--requests", type=int, default=500, help="requests per simulated run")
    ap.add_argument("--out", type=Path, default=Path("docs/results/sim_paper.json"))
    ap.add_argument("--jobs", type=int, default=1, help="independent simulations in this many processes")
    a = ap.parse_args()
    global JOBS, SAVE
    JOBS, SAVE = a.jobs, a.out
    only = set(a.only.split(","))
    out = json.loads(a.out.read_text()) if a.out.exists() else {}
    t = time.perf_counter()
    print(f"# The paper's experiments, SIMULATED (cost model: GPU roofline, costmodel/gpu.py; behaviour: parametric, "
          f"3.01 positions per forward at threshold 0.9; {a.requests} requests per run; argv {sys.argv[1:]})")
    for key, fn in (("A", exp_a), ("B", exp_b), ("C", exp_c), ("D", exp_d)):
        if key in only:
            fn(a.requests, out)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(out, indent=1, default=str))
    print(f"\n(simulated in {time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
