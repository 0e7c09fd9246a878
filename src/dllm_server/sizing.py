"""The capacity planner behind `dllm-server plan`: simulate candidate configurations for a workload, device and
SLO and rank them by the highest Poisson rate that meets it. Every number is simulated; the cost model's
assumptions travel with the result (`describe`)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from loadgen.capacity import find_capacity_sync

from .config import ServerConfig
from .sim.behaviour import ParametricBehaviour, ReplayBehaviour, load_trace_rows
from .sim.cluster import Simulator
from .sim.workload import preset_workload, rescale, trace_workload

SLO_METRICS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class Candidate:
    name: str
    changes: dict


def make_behaviour(spec: tuple):
    """A fresh behaviour model per run from a picklable spec, so candidates can run in parallel processes."""
    kind, arg, seed = spec
    return ParametricBehaviour(arg, seed) if kind == "parametric" else ReplayBehaviour(arg, seed)


@dataclass
class Setup:
    """What every candidate shares: the model's profile, cost and behaviour models, the workload."""
    model_info: object
    logit_shift: int
    cost: object
    behaviour: tuple                   # make_behaviour's spec
    requests: list                     # rescaled per probe
    base: ServerConfig
    slo_metric: str = "p99"
    slo_s: float = 10.0
    notes: dict = field(default_factory=dict)


def candidates(num_workers: int, taus=(256, 1024, 4096, None), theta: int = 8192, splits: bool = True,
               tau_split: int | None = 1024) -> list[Candidate]:
    """Colocated at each tau; every P:D split of the workers, disaggregated and hybrid."""
    out = [Candidate(f"colocated x{num_workers}, tau={'inf' if t is None else t}",
                     dict(placement="colocated", num_workers=num_workers, token_budget=t)) for t in taus]
    if splits:
        for p in range(1, num_workers):
            d = num_workers - p
            out.append(Candidate(f"{p}P{d}D (disaggregated)", dict(placement="disaggregated", num_workers=d,
                                                                  num_prefill_workers=p, token_budget=tau_split)))
            out.append(Candidate(f"{p}P{d}C (hybrid, theta={theta})",
                                 dict(placement="hybrid", num_workers=d, num_prefill_workers=p,
                                      overflow_threshold_tokens=theta, token_budget=tau_split)))
    return out


def tp_candidates(num_workers: int, degrees, heads: int, kv_heads: int, taus=(1024,)) -> tuple[list[Candidate], list[str]]:
    """Colocated "N x TPd" candidates for every degree d > 1 that divides the heads and fits; (candidates, skipped)."""
    out, skipped = [], []
    for d in sorted(set(degrees)):
        if d <= 1:
            continue
        if heads % d or kv_heads % d:
            skipped.append(f"TP{d}: does not divide the model's {heads} heads and {kv_heads} KV heads")
            continue
        n = num_workers // d
        if n < 1:
            skipped.append(f"TP{d}: more than the {num_workers} GPUs")
            continue
        idle = f", {num_workers - n * d} GPUs idle" if num_workers % d else ""
        for t in taus:
            out.append(Candidate(f"{n} x TP{d}, tau={'inf' if t is None else t}{idle}",
                                 dict(placement="colocated", num_workers=n, tensor_parallel_size=d, token_budget=t)))
    return out, skipped


def instance_cost(setup: Setup, degree: int):
    if degree == 1:
        return setup.cost
    if not hasattr(setup.cost, "tp"):
        raise ValueError("tensor-parallel candidates need a GPU cost model (--device h100|h200)")
    return dataclasses.replace(setup.cost, tp=degree)


def simulate(setup: Setup, changes: dict, rate: float) -> dict:
    cfg = setup.base.replace(**changes)
    degree = cfg.tensor_parallel_size
    costs = None
    if degree > 1:
        costs = [instance_cost(setup, degree)] * cfg.num_workers
    sim = Simulator(cfg, setup.cost if costs is None else None, make_behaviour(setup.behaviour), setup.model_info,
                    logit_shift=setup.logit_shift, costs=costs)
    return sim.run(rescale(setup.requests, rate)).summary()


def meets(setup: Setup, s: dict) -> bool:
    return (s["completed"] == s["requests"] and s[f"{setup.slo_metric}_s"] <= setup.slo_s)


def capacity(setup: Setup, changes: dict, start_rate: float = 1.0, tolerance: float = 0.05) -> dict:
    """One candidate's capacity search; the result at its capacity (None if even the lowest rate misses)."""
    def measure(rate):
        return simulate(setup, changes, rate)
    found = find_capacity_sync(measure, lambda s: meets(setup, s), start_rate=start_rate, tolerance=tolerance,
                               max_rate=start_rate * 2 ** 12, max_steps=24)
    at = next((h["result"] for h in found["history"] if h["rate"] == found["capacity"]), None)
    return {"capacity_req_s": found["capacity"] or 0.0, "upper_req_s": found["upper"], "at_capacity": at,
            "probes": len(found["history"])}


def _capacity_job(setup: Setup, changes: dict, start_rate: float, tolerance: float) -> dict:
    return capacity(setup, changes, start_rate, tolerance)


def plan(setup: Setup, cands: list[Candidate], start_rate: float = 1.0, tolerance: float = 0.05,
         progress: bool = True, jobs: int = 1) -> list[dict]:
    """Every candidate's capacity, best first; `jobs` > 1 simulates candidates in that many processes."""
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(cands), desc="candidates", unit="config", leave=False)
    results: dict[str, dict] = {}
    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
            futs = {ex.submit(_capacity_job, setup, c.changes, start_rate, tolerance): c for c in cands}
            for f in as_completed(futs):
                results[futs[f].name] = f.result()
                if bar is not None:
                    bar.update(1)
    else:
        for c in cands:
            results[c.name] = capacity(setup, c.changes, start_rate, tolerance)
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"{c.name}: {results[c.name]['capacity_req_s']:.2f} req/s")
    if bar is not None:
        bar.close()
    rows = [{"candidate": c.name, "config": c.changes, **results[c.name]} for c in cands]
    rows.sort(key=lambda r: -r["capacity_req_s"])
    return rows


def table(rows: list[dict], setup: Setup) -> str:
    head = ("| rank | candidate | capacity at SLO (req/s) | mean (s) | p99 (s) | output tok/s |\n"
            "|---|---|---|---|---|---|")
    lines = [head]
    for i, r in enumerate(rows, 1):
        a = r["at_capacity"] or {}
        fmt = (lambda k: f"{a[k]:.2f}" if k in a else "-")
        lines.append(f"| {i} | {r['candidate']} | {r['capacity_req_s']:.2f} | {fmt('mean_s')} | {fmt('p99_s')} | "
                     f"{a.get('tok_s', 0):.0f} |")
    best = rows[0] if rows else None
    if best and best["capacity_req_s"] > 0:
        lines.append(f"\nrecommendation (simulated): **{best['candidate']}**, {best['capacity_req_s']:.2f} req/s with "
                     f"{setup.slo_metric} end-to-end latency <= {setup.slo_s:g} s")
    else:
        lines.append("\nno candidate meets the SLO at the lowest rate probed")
    return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    names = [r["candidate"] for r in rows][::-1]
    ax.barh(names, [r["capacity_req_s"] for r in rows][::-1], color="#4c72b0")
    ax.set_xlabel("capacity at the SLO (req/s, simulated)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def build_setup(model: str, device: str, workload: str | None, trace: str | None, num_requests: int,
                slo_metric: str, slo_s: float, *, link: str = "nvlink", block_length: int = 32,
                threshold: float = 0.9, max_tokens: int | None = None, gpu_bench: str | None = None,
                calibration: str | None = None, replay: str | None = None, seed: int = 0,
                num_workers: int = 1) -> Setup:
    """Profiles by name: a GPU device with a roofline (or `gpu_bench`-fitted) model, or "cpu" with a calibration."""
    from .costmodel.gpu import MODELS, from_gpu_bench, gpu_cost
    if slo_metric not in SLO_METRICS:
        raise ValueError(f"slo_metric: one of {SLO_METRICS}, got {slo_metric!r}")
    base = ServerConfig(block_length=block_length, threshold=threshold, max_waiting_requests=1 << 20)
    if device == "cpu":
        if calibration is None:
            raise ValueError("calibration: device cpu needs the file written by `dllm-server calibrate`")
        from .costmodel.fitted import load_cpu_cost
        from .checkpoint import model_path, read_config
        cost = load_cpu_cost(calibration, num_workers)
        cfg = read_config(model_path(None))
        from .messages import ModelInfo
        info = ModelInfo("llada", cfg["vocab_size"], cfg["embedding_size"], cfg["mask_token_id"],
                         cfg["eos_token_id"], cfg["max_sequence_length"], cfg["d_model"], cfg["n_layers"],
                         cfg["n_heads"], cfg["n_kv_heads"], cfg["d_model"] // cfg["n_heads"], cfg["mlp_hidden_size"])
        shift, max_len = 0, cfg["max_sequence_length"]
        base = base.replace(kv_cache_tokens=32768)
    else:
        shape = MODELS[model]
        cost = (from_gpu_bench(gpu_bench, model, link, block_length) if gpu_bench
                else gpu_cost(model, device, link, block_length))
        info, shift, max_len = shape.model_info(), shape.logit_shift, shape.max_len
        base = base.replace(num_pages=cost.kv_pool_tokens() // base.page_size)
    if trace is not None:
        requests = trace_workload(trace, None, max_tokens, threshold)[:num_requests]
    else:
        requests = preset_workload(workload or "sharegpt", num_requests, 1.0, seed, max_tokens=max_tokens,
                                   max_len=min(max_len, 8192))
    spec = ("replay", load_trace_rows(replay), seed) if replay is not None else ("parametric", model, seed)
    return Setup(info, shift, cost, spec, requests, base, slo_metric, slo_s,
                 {"cost": cost.describe(), "workload": trace or workload, "requests": num_requests,
                  "max_tokens": max_tokens, "threshold": threshold, "block_length": block_length})


def run_plan(args) -> int:
    setup = build_setup(args.model, args.device, args.workload, args.trace, args.requests, args.slo_metric,
                        args.slo_s, link=args.link, block_length=args.block_length, threshold=args.threshold,
                        max_tokens=args.max_tokens, gpu_bench=args.gpu_bench, calibration=args.calibration,
                        replay=args.replay, seed=args.seed, num_workers=args.workers)
    taus = tuple(None if t in ("inf", "none") else int(t) for t in args.taus.split(","))
    cands = candidates(args.workers, taus, args.theta, splits=args.workers > 1)
    degrees = [int(d) for d in str(getattr(args, "tensor_parallel", "1") or "1").split(",") if d.strip()]
    tp, skipped = tp_candidates(args.workers, degrees, setup.model_info.num_heads, setup.model_info.num_kv_heads,
                                taus)
    if tp:
        instance_cost(setup, max(c.changes["tensor_parallel_size"] for c in tp))   # a CPU profile fails here, early
    cands += tp
    setup.notes["tensor_parallel"] = {"degrees": degrees, "skipped": skipped,
                                      "kv_pool_tokens": {d: instance_cost(setup, d).kv_pool_tokens() for d in
                                                         sorted({c.changes["tensor_parallel_size"] for c in tp})}}
    rows = plan(setup, cands, args.start_rate, args.tolerance, progress=not args.json and not args.no_progress,
                jobs=args.jobs)
    if args.plot:
        plot(rows, args.plot, f"simulated: {args.model} on {args.workers} x {args.device}, "
                              f"{args.trace or args.workload}, {args.slo_metric} <= {args.slo_s:g} s")
    if args.json:
        print(json.dumps({"simulated": True, "slo": {"metric": args.slo_metric, "seconds": args.slo_s},
                          "workers": args.workers, "ranking": rows, "assumptions": setup.notes},
                         indent=1, default=str))
    else:
        print(f"# simulated plan: {args.model} on {args.workers} x {args.device} ({setup.cost.name}), workload "
              f"{args.trace or args.workload} ({args.requests} requests per probe), SLO {args.slo_metric} e2e <= "
              f"{args.slo_s:g} s\n")
        for why in skipped:
            print(f"left out: {why}")
        if tp:
            print("TP candidates: N x TPd instances on the same GPUs, each one simulated worker whose forward is the "
                  "roofline at degree d (projections and attention split d ways, two ring all-reduces a layer) and "
                  "whose KV pool spans its d GPUs (simulated)\n")
        print(table(rows, setup))
        print(f"\ncost model: {json.dumps(dataclasses.asdict(setup.cost.eff) if hasattr(setup.cost, 'eff') else setup.cost.describe(), default=str)}")
    return 0
