"""SLO-aware decoding under load on real servers: fixed thresholds and the slo policy with and without load
control, at multiples of fixed 0.9's capacity: SLO attainment, latency, thresholds, quality, tick cost.
`--at-rate` runs one configuration at one rate instead (side-by-side checks of one change at one load).

    python -m bench.slo [--model DIR] [--requests 40] [--rates 0.5,0.75,1,1.5,2] [--plot docs/img/slo.png]
    python -m bench.slo --task demo --task-share 0.5 --fixed 0.9,0.7,0.5     # + the equal-accuracy headline
    python -m bench.slo --at-rate 9.75 --slo-ms 1647 --config slo --task demo --task-share 0.5 [--runs 2]
"""
from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

import httpx
import numpy as np

import dllm_server
from bench.harness import Table, Timer, parser, server, write_json
from bench.quality import agreement, interleave, load_task, pseudo_log_likelihood, task_scores
from dllm_server import LLM, SamplingParams
from dllm_server.checkpoint import embedded_model_path
from loadgen.arrivals import arrival_offsets
from loadgen.capacity import find_capacity
from loadgen.run import RunConfig, benchmark
from loadgen.tokens import load_counter
from loadgen.workload import RequestSpec

PROMPTS = ["Good morrow, my lord. What news?", "Tell me a story.", "Who art thou?", "What is love?",
           "My lord, the horses are ready.", "Why dost thou frown so?", "What did the messenger say?",
           "Sir, I have a letter for you.", "Will the army march tonight?", "Is this a dagger I see?",
           "How long have you been here?", "Pray, tell me of your travels.", "Where shall we dine?",
           "The king is dead, they say.", "Dost thou love me?", "What news from Rome?"]
POLICIES = [("slo, no load control", ["--threshold-policy", "slo", "--no-load-control"]),
            ("slo + load control", ["--threshold-policy", "slo"])]


def configs(fixed: list[float]) -> list[tuple[str, list[str]]]:
    """Fixed 0.9 first (the SLO and the capacity are its), then the other fixed thresholds, then
    the policy with and without load control."""
    values = [0.9] + [t for t in fixed if t != 0.9]
    return [(f"fixed {t:g}", ["--threshold", str(t)]) for t in values] + POLICIES


def workload(n: int, max_tokens: int, seed: int) -> list[RequestSpec]:
    """`n` chat requests, each a prompt of PROMPTS drawn at random."""
    rng = np.random.default_rng(seed)
    return [RequestSpec(PROMPTS[int(rng.integers(len(PROMPTS)))], 12, max_tokens) for _ in range(n)]


def task_workload(task: list[dict], n: int, max_tokens: int, share: float = 1.0, seed: int = 0) -> list[RequestSpec]:
    """`n` requests, round(share * n) of them the task's items (quality.interleave's order, cycling)
    at seeded positions, the rest chat prompts as `workload` draws them. A task request carries
    its item (meta["item"]): it is scored against its own reference whatever else fails."""
    items, k = interleave(task), round(share * n)
    on_task = set(range(n)) if k >= n else set(np.random.default_rng(seed).choice(n, k, replace=False).tolist())
    chat = iter(workload(n - len(on_task), max_tokens, seed))
    specs, j = [], 0
    for i in range(n):
        if i in on_task:
            item, j = items[j % len(items)], j + 1
            specs.append(RequestSpec(item["question"], 64, max_tokens, meta={"item": item}))
        else:
            specs.append(next(chat))
    return specs


async def run_at(url: str, specs, rate: float, slo_ms: float, seed: int) -> dict:
    cfg = RunConfig(base_url=url, endpoint="chat", temperature=0.0, show_progress=False, slo_ms=slo_ms)
    offsets = arrival_offsets("poisson", rate, len(specs), np.random.default_rng(seed))
    return await benchmark(cfg, specs, offsets, load_counter(None))


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


async def tick_cost(url: str, prompt: str, n: int = 64) -> float:
    """Front-loop seconds per scheduler tick while `n` requests are in flight together."""
    t0, s0 = metric(url, "dllm:scheduler_ticks_total"), metric(url, "dllm:scheduler_tick_seconds_total")
    async with httpx.AsyncClient(base_url=url, timeout=600, trust_env=False) as c:
        await asyncio.gather(*[c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": prompt}], "max_tokens": 128, "ignore_eos": True,
            "slo_ms": 60_000, "seed": i}) for i in range(n)])
    t1, s1 = metric(url, "dllm:scheduler_ticks_total"), metric(url, "dllm:scheduler_tick_seconds_total")
    return (s1 - s0) / max(1.0, t1 - t0)


def forwards_per_answer(result: dict) -> float | None:
    """Forwards per finished request over the run, from the server's counters (before/after)."""
    d = result.get("server_metrics", {}).get("deltas", {})
    steps = sum(v for k, v in d.items() if k.split("{")[0] == "dllm:denoising_steps_total")
    done = sum(v for k, v in d.items() if k.split("{")[0] == "dllm:request_success_total")
    return steps / done if done else None


def quality(llm, result: dict, specs, refs: dict[str, list[int]]) -> dict:
    """One run's answers (loadgen's per-request arrays, in spec order) next to their specs."""
    tok = llm.tokenizer
    agree, pll, pairs = [], [], []
    for spec, text, ok in zip(specs, result["requests"]["texts"], result["requests"]["ok"], strict=True):
        if "item" in spec.meta:
            pairs.append((spec.meta["item"], text if ok else None))
        if not ok:
            continue
        ids = tok.hf.encode(text, add_special_tokens=False)
        agree.append(agreement(ids, refs[spec.prompt]))
        prompt_ids = tok.apply_chat_template([{"role": "user", "content": spec.prompt}])
        pll.append(pseudo_log_likelihood(llm, prompt_ids, ids))
    out = {"agreement": statistics.mean(agree) if agree else None, "pll": statistics.mean(pll) if pll else None,
           "forwards_per_answer": forwards_per_answer(result)}
    if pairs:
        out["task"] = task_scores(pairs)
    return out


def specs_of(a) -> list[RequestSpec]:
    """The run's requests: --task's items (--task-share of them) among the chat prompts, or chat alone."""
    task = load_task(a.task) if a.task else None
    return (task_workload(task, a.requests, a.max_tokens, a.task_share, a.seed) if task
            else workload(a.requests, a.max_tokens, a.seed))


def server_flags(a) -> list[str]:
    return ["--dtype", a.dtype, "--threads-per-worker", str(a.threads), "--max-waiting-requests", "4096",
            "--scheduling-policy", a.scheduling_policy]


# 1. The SLO: --slo-factor x the --unloaded-quantile of fixed 0.9's latency, --unloaded-requests
#    timed one at a time. 2. Fixed 0.9's capacity at that SLO (>= 90 % within it, loadgen's capacity
#    search). 3. Poisson load at --rates x that capacity for every configuration. 4. Every answer's
#    quality, offline with the same model (bench/quality.py), task accuracy with --task, forwards per
#    answer (the server's counters). 5. The policy's cost on the front loop: scheduler seconds per tick
#    with 64 requests in flight (the server's dllm:scheduler_tick_seconds / dllm:scheduler_ticks).
async def main_async(a) -> dict:
    model = a.model or str(embedded_model_path())
    specs = specs_of(a)
    common = server_flags(a)
    logs = Path(tempfile.mkdtemp(prefix="bench-slo-"))
    report: dict = {"model": model, "requests_per_rate": a.requests, "max_tokens": a.max_tokens,
                    "task": a.task, "task_share": a.task_share if a.task else None, "configs": {}}
    # 1-2: the SLO and the capacity of fixed 0.9
    all_configs = configs(a.fixed)
    with server(model, *common, *all_configs[0][1], log_path=logs / "base.log", stop_s=30) as base:
        async with httpx.AsyncClient(base_url=base.url, timeout=600, trust_env=False) as c:
            lat = []
            for spec in specs[:a.unloaded_requests + 1]:
                with Timer() as t:
                    await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": spec.prompt}],
                                                               "max_tokens": a.max_tokens, "temperature": 0})
                lat.append(t.s)
        # the slow end of the workload: with demo tasks (one or two forwards) beside chat answers (~32)
        # a median set by the tasks gives an SLO no chat answer meets at any load, and the capacity
        # search halves its rate without end
        unloaded_ms = 1e3 * float(np.quantile(lat[1:], a.unloaded_quantile))
        slo_ms = a.slo_factor * unloaded_ms
        found = await find_capacity(lambda rate: run_at(base.url, specs[: a.probe_requests], rate, slo_ms, a.seed),
                                    lambda r: r["summary"]["slo"]["attainment"] >= 0.9, start_rate=a.start_rate,
                                    tolerance=0.1, max_rate=a.max_rate, min_rate=a.start_rate / 8)
        capacity = found["capacity"] or a.start_rate
        report.update({"unloaded_ms": unloaded_ms, "slo_ms": slo_ms, "capacity_fixed_0.9": capacity,
                       "capacity_search": [{"rate": h["rate"], "ok": h["ok"]} for h in found["history"]]})
        print(f"unloaded latency (fixed 0.9) {unloaded_ms:.0f} ms; SLO {slo_ms:.0f} ms; capacity of fixed 0.9 at "
              f"90 % attainment: {capacity:.2f} req/s", flush=True)
    # 3: every configuration at every rate; 5: tick cost
    rates = [m * capacity for m in a.rates]
    for name, flags in all_configs:
        with server(model, *common, *flags, log_path=logs / f"{name.replace(' ', '_')}.log", stop_s=30) as s:
            runs = []
            for m, rate in zip(a.rates, rates):
                r = await run_at(s.url, specs, rate, slo_ms, a.seed + 1)
                runs.append({"multiple": m, "rate": rate, "result": r})
                sm = r["summary"]
                print(f"{name} @ {m}x ({rate:.2f} req/s): attainment {100 * sm['slo']['attainment']:.0f} %, "
                      f"mean {sm['e2el_ms']['mean']:.0f} ms, p99 {sm['e2el_ms']['p99']:.0f} ms, mean threshold "
                      f"{sm['slo']['mean_threshold']}", flush=True)
            tick = await tick_cost(s.url, PROMPTS[0]) if name in ("fixed 0.9", "slo + load control") else None
            models = {k: metric(s.url, k) for k in ("dllm:step_time_rel_error", "dllm:threshold_cap")}
        report["configs"][name] = {"runs": runs, "tick_s": tick, "server": models}
    # 4: quality, offline
    llm = LLM(model, dtype=a.dtype)
    refs = {}
    for p in {sp.prompt for sp in specs}:
        out = llm.chat([{"role": "user", "content": p}], SamplingParams(max_tokens=a.max_tokens, threshold=0.99))[0]
        refs[p] = llm.tokenizer.hf.encode(out.text, add_special_tokens=False)
    for name, c in report["configs"].items():
        for run in c["runs"]:
            run["quality"] = quality(llm, run["result"], specs, refs)
    return report


def _opt(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def print_tables(rep: dict) -> None:
    print(f"\nmodel {rep['model']}; {rep['requests_per_rate']} requests per rate, max_tokens {rep['max_tokens']}, "
          f"greedy; SLO {rep['slo_ms']:.0f} ms (unloaded fixed-0.9 latency {rep['unloaded_ms']:.0f} ms); capacity of "
          f"fixed 0.9 = {rep['capacity_fixed_0.9']:.2f} req/s")
    if rep.get("task"):
        print(f"task {rep['task']}: {100 * rep['task_share']:.0f} % of the requests, the rest chat prompts; accuracy "
              "over every task request (a failed one counts wrong), each against its own reference")
    has_task = any("task" in r["quality"] for c in rep["configs"].values() for r in c["runs"])
    print()
    table = Table(["config", "load", ("rate (req/s)", ".2f"), "SLO attainment", ("mean latency (ms)", ".0f"),
                   ("p99 (ms)", ".0f"), "mean threshold", "agreement with 0.99", "pseudo log-lik",
                   "forwards per answer", *(["accuracy", "failed"] if has_task else [])])
    for name, c in rep["configs"].items():
        for run in c["runs"]:
            s, q = run["result"]["summary"], run["quality"]
            t = q.get("task")
            table.row(name, f"{run['multiple']:g}x", run["rate"], f"{100 * s['slo']['attainment']:.0f} %",
                      s["e2el_ms"]["mean"], s["e2el_ms"]["p99"], _opt(s["slo"]["mean_threshold"], ".3f"),
                      _opt(q["agreement"], ".3f"), _opt(q["pll"], ".3f"), _opt(q["forwards_per_answer"], ".1f"),
                      *([_opt(t["accuracy"], ".3f"), f"{t['failed']}/{t['requests']}"] if t else
                        [""] * 2 if has_task else []))
    if has_task:
        tasks = list(dict.fromkeys(t for c in rep["configs"].values() for r in c["runs"]
                                   for t in r["quality"].get("task", {}).get("per_task", {})))
        table = Table(["config", "load", *tasks], "\nper-task accuracy (requests):\n")
        for name, c in rep["configs"].items():
            for run in c["runs"]:
                per = run["quality"].get("task", {}).get("per_task", {})
                table.row(name, f"{run['multiple']:g}x",
                          *(f"{per[t]['accuracy']:.2f} ({per[t]['requests']})" if t in per else "-" for t in tasks))
    if has_task:
        headline(rep)
    ticks = {n: c["tick_s"] for n, c in rep["configs"].items() if c["tick_s"] is not None}
    print("\nfront-loop time per scheduler tick, 64 requests in flight: " +
          ", ".join(f"{n} {1e6 * t:.0f} us" for n, t in ticks.items()))
    errs = {n: c["server"]["dllm:step_time_rel_error"] for n, c in rep["configs"].items() if "slo" in n}
    print("step-time model, mean relative error on the iterations it predicted: " +
          ", ".join(f"{n} {100 * e:.1f} %" for n, e in errs.items()))


def headline(rep: dict) -> None:
    """DiLaServe's shape: at each load, slo + load control against fixed 0.9 and against the fixed
    threshold whose accuracy (at that load) is nearest the policy's, among those run."""
    acc = lambda run: run["quality"].get("task", {}).get("accuracy")
    att = lambda run: 100 * run["result"]["summary"]["slo"]["attainment"]
    policy = rep["configs"]["slo + load control"]["runs"]
    fixed = {n: c["runs"] for n, c in rep["configs"].items() if n.startswith("fixed")}
    table = Table(["load", "slo + load control", "fixed 0.9", "gain over 0.9 (points)",
                   "accuracy loss vs 0.9 (points)", "equal-accuracy fixed", "its attainment, accuracy",
                   "gain over it (points)"],
                  "\nslo + load control against fixed 0.9 and the equal-accuracy fixed threshold (attainment, "
                  "accuracy):\n")
    for k, run in enumerate(policy):
        if acc(run) is None:
            continue
        f9 = fixed["fixed 0.9"][k]
        name, eq = min(((n, runs[k]) for n, runs in fixed.items() if acc(runs[k]) is not None),
                       key=lambda x: (abs(acc(x[1]) - acc(run)), x[0]))
        table.row(f"{run['multiple']:g}x", f"{att(run):.0f} %, {acc(run):.3f}", f"{att(f9):.0f} %, {acc(f9):.3f}",
                  f"{att(run) - att(f9):+.0f}", f"{100 * (acc(f9) - acc(run)):+.1f}", name,
                  f"{att(eq):.0f} %, {acc(eq):.3f}", f"{att(run) - att(eq):+.0f}")


def plot(rep: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name, c in rep["configs"].items():
        xs = [r["multiple"] for r in c["runs"]]
        axes[0].plot(xs, [100 * r["result"]["summary"]["slo"]["attainment"] for r in c["runs"]], "-o", label=name)
        axes[1].plot(xs, [r["result"]["summary"]["slo"]["mean_threshold"] or np.nan for r in c["runs"]], "-o")
        axes[2].plot(xs, [r["quality"]["agreement"] for r in c["runs"]], "-o")
    for ax, t in zip(axes, ("SLO attainment (%)", "mean block threshold", "token agreement with threshold 0.99")):
        ax.set_title(t)
        ax.set_xlabel("offered load (x capacity of fixed 0.9)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def at_rate(a) -> None:
    """One configuration at one Poisson rate, --runs times on one fresh server after a short warm-up
    at 1 req/s: SLO attainment, mean latency and mean block threshold per run (run it once per code
    version, e.g. with PYTHONPATH at a worktree of the older commit)."""
    flags = ["--threshold-policy", "slo"] if a.config == "slo" else ["--threshold", a.config]
    specs = specs_of(a)
    print(f"code from {Path(dllm_server.__file__).parent}; config {a.config}, {a.at_rate} req/s, SLO {a.slo_ms} ms")
    with server(a.model, *server_flags(a), *flags, stop_s=30) as s:
        asyncio.run(run_at(s.url, specs[:6], 1.0, a.slo_ms, a.seed + 3))          # warm-up at a light load
        table = Table(["run", "SLO attainment", ("mean latency (ms)", ".0f"), ("mean threshold", ".3f")])
        for k in range(a.runs):
            sm = asyncio.run(run_at(s.url, specs, a.at_rate, a.slo_ms, a.seed + 1 + k))["summary"]
            table.row(k, f"{100 * sm['slo']['attainment']:.0f} %", sm["e2el_ms"]["mean"], sm["slo"]["mean_threshold"])


def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: the embedded demo model)", threads=1, seed=0)
    ap.add_argument("--task", help="GSM8K-style JSONL ({'question', 'answer'}), or 'demo' (the shipped demo-task "
                    "set): report accuracy too, overall and per task")
    ap.add_argument("--task-share", type=float, default=1.0,
                    help="share of the requests from --task, the rest the chat prompts (default: all)")
    ap.add_argument("--requests", type=int, default=40, help="requests per rate and configuration")
    ap.add_argument("--probe-requests", type=int, default=24, help="requests per capacity-search probe")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=[0.5, 0.75, 1.0, 1.5, 2.0])
    ap.add_argument("--fixed", type=lambda t: [float(x) for x in t.split(",")], default=[0.9, 0.7],
                    help="fixed thresholds to run besides the policy (0.9 always)")
    ap.add_argument("--slo-factor", type=float, default=3.0)
    ap.add_argument("--unloaded-requests", type=int, default=7, help="requests timed one at a time (after one warm-up)")
    ap.add_argument("--unloaded-quantile", type=float, default=0.5,
                    help="the SLO is --slo-factor x this quantile of their latencies (0.5: the median; with "
                         "--task, use a high one so the slow kind can meet it)")
    ap.add_argument("--start-rate", type=float, default=2.0)
    ap.add_argument("--max-rate", type=float, default=64.0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--scheduling-policy", default="deadline", choices=("fcfs", "deadline"),
                    help="every server's --scheduling-policy")
    ap.add_argument("--json", default="docs/results/slo.json")
    ap.add_argument("--plot", default="docs/img/slo.png")
    one = ap.add_argument_group("one configuration at one rate (--at-rate)")
    one.add_argument("--at-rate", type=float, help="requests per second (Poisson): run just --config at this rate")
    one.add_argument("--slo-ms", type=float, help="the SLO of --at-rate")
    one.add_argument("--config", default="slo", help="'slo' (--threshold-policy slo, load control on) or a fixed "
                                                     "threshold such as 0.5")
    one.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    if not 0 < a.task_share <= 1:
        ap.error("--task-share: must be in (0, 1]")
    if a.at_rate is not None:
        if a.slo_ms is None:
            ap.error("--at-rate needs --slo-ms")
        return at_rate(a)
    rep = asyncio.run(main_async(a))
    for c in rep["configs"].values():              # keep the JSON small: summaries only
        for run in c["runs"]:
            run["result"] = {"summary": run["result"]["summary"]}
    write_json(a.json, rep)
    print_tables(rep)
    plot(rep, a.plot)
    print(f"\nplot: {a.plot}; JSON: {a.json}")


if __name__ == "__main__":
    main()
