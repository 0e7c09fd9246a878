"""A simultaneous burst (issue 33): N chat requests at once at one `--threshold-policy slo` server, first
each naming threshold 0.9, then with `slo_ms` at fixed 0.9's --quantile latency, then fixed 0.9 again.

    python -m bench.slo_burst [--model DIR] [--requests 40] [--rounds 2] [--fixed-low 0.5] [--waves] [--json out.json]
    python -m bench.slo_burst --from-json out.json [--waves] [--per-request]    # a saved run's tables again
"""
from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.harness import Table, Timer, parser, server, write_json
from dllm_server.demo_tasks import is_correct, load_eval

# Reported: SLO attainment of both, the thresholds the policy chose, forwards per answer and the
# demo tasks' exact match, --rounds times on the same server. Each round's second fixed-0.9 run,
# scored against the SLO its first run set, is the noise floor of the comparison (the burst's
# waves shift from one run to the next, and the SLO sits on a wave's end).

CHAT = ["Good morrow, my lord. What news?", "Who art thou?", "What is love?", "Dost thou love me?",
        "Why dost thou frown so?", "What news from Rome?", "Where shall we dine?", "Is this a dagger I see?"]


def burst_requests(n: int, chat_share: float = 0.2, seed: int = 0) -> list[dict]:
    """n requests: demo-task questions (every task, in turn) and a share of chat cues; greedy,
    max_tokens 64. Each carries its reference ("reference": None for chat)."""
    rng = np.random.default_rng(seed)
    items = load_eval()
    by_task: dict[str, list] = {}
    for it in items:
        by_task.setdefault(it.task, []).append(it)
    tasks = sorted(by_task)
    out = []
    for i in range(n):
        if rng.random() < chat_share:
            out.append({"content": CHAT[i % len(CHAT)], "reference": None, "task": "chat"})
        else:
            it = by_task[tasks[i % len(tasks)]][(i // len(tasks)) % len(by_task[tasks[0]])]
            out.append({"content": it.question, "reference": it.answer, "task": it.task})
    return out


async def burst(url: str, reqs: list[dict], extra: dict) -> list[dict]:
    """All at once; per request its latency (s), answer, forwards, thresholds and SLO verdict."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        async def one(r):
            body = {"messages": [{"role": "user", "content": r["content"]}], "max_tokens": 64, "temperature": 0.0,
                    **extra}
            with Timer() as t:
                resp = await c.post("/v1/chat/completions", json=body)
            dt = t.s
            resp.raise_for_status()
            ch = resp.json()["choices"][0]
            return {"latency_s": dt, "answer": ch["message"]["content"], "forwards": ch["dllm"]["forwards"],
                    "thresholds": ch["dllm"]["thresholds"], "slo_met": ch["dllm"].get("slo_met"), **r}
        return await asyncio.gather(*[one(r) for r in reqs])


def waves(latencies: list[float], gap_s: float = 0.03) -> list[tuple[float, int]]:
    """Completions grouped into waves (a gap over `gap_s` starts a new one): (end of wave, size)."""
    lat = sorted(latencies)
    out, start = [], 0
    for i in range(1, len(lat) + 1):
        if i == len(lat) or lat[i] - lat[i - 1] > gap_s:
            out.append((round(lat[i - 1], 3), i - start))
            start = i
    return out


def summarise(outs: list[dict], slo_s: float) -> dict:
    scored = [o for o in outs if o["reference"] is not None]
    taus = [t for o in outs for t in o["thresholds"]]
    return {"attainment": sum(o["latency_s"] <= slo_s for o in outs) / len(outs),
            "exact_match": sum(is_correct(o["answer"], o["reference"]) for o in scored) / max(1, len(scored)),
            "forwards_per_answer": statistics.mean(o["forwards"] for o in outs),
            "mean_threshold": statistics.mean(taus), "max_threshold": max(taus),
            "thresholds_used": sorted(set(taus)), "p50_latency_s": statistics.median(o["latency_s"] for o in outs),
            "wall_s": max(o["latency_s"] for o in outs),
            "task_waves": waves([o["latency_s"] for o in outs if o["task"] != "chat"])}


def run(model: str | None, n: int, rounds: int, quantile: float, log_dir: Path, extra_flags=(),
        low: float | None = None) -> dict:
    with server(model, "--threshold-policy", "slo", *extra_flags, log_path=log_dir / "slo_burst_server.log",
                stop_s=30) as s:
        reqs = burst_requests(n)
        asyncio.run(burst(s.url, reqs[:4], {"threshold": 0.9}))      # warm-up
        results = []
        for k in range(rounds):
            fixed = asyncio.run(burst(s.url, reqs, {"threshold": 0.9}))
            slo_s = float(np.quantile([o["latency_s"] for o in fixed], quantile))
            time.sleep(0.5)
            policy = asyncio.run(burst(s.url, reqs, {"slo_ms": 1e3 * slo_s}))
            time.sleep(0.5)
            # the noise floor: fixed 0.9 again, against the SLO its first run set
            repeat = asyncio.run(burst(s.url, reqs, {"threshold": 0.9}))
            results.append({"round": k, "slo_ms": 1e3 * slo_s, "fixed_0.9": summarise(fixed, slo_s),
                            "slo_policy": summarise(policy, slo_s), "fixed_0.9_again": summarise(repeat, slo_s),
                            "policy_requests": [{f: o[f] for f in ("latency_s", "task", "forwards", "thresholds")}
                                                for o in sorted(policy, key=lambda o: o["latency_s"])]})
            if low is not None:     # what the lowest threshold alone buys on this burst: the knob's reach
                time.sleep(0.5)
                results[-1][f"fixed_{low:g}"] = summarise(asyncio.run(burst(s.url, reqs, {"threshold": low})), slo_s)
            time.sleep(0.5)
    return {"model": model or "embedded demo model", "requests": n, "quantile": quantile, "rounds": results}


def configs(rd: dict) -> list[str]:
    """The configurations a round ran (fixed_0.9, slo_policy, fixed_0.9_again, fixed_<low>)."""
    return [k for k, v in rd.items() if isinstance(v, dict)]


def report(r: dict, waves_too: bool = False, per_request: bool = False) -> None:
    """The tables of a run (or of its saved JSON): per round, then pooled over the rounds."""
    rounds = r["rounds"]
    print(f"burst of {r['requests']} at once, model {r['model']}; SLO = the latency fixed 0.9 met for "
          f"{100 * r['quantile']:.0f} % of them, per round\n")
    table = Table(["round", ("SLO (s)", ".2f"), "config", "SLO attainment", "exact match (tasks)",
                   ("forwards / answer", ".1f"), ("mean threshold", ".3f"), "thresholds used",
                   ("p50 latency (s)", ".2f")])
    for rd in rounds:
        for name in configs(rd):
            s = rd[name]
            table.row(rd["round"], rd["slo_ms"] / 1e3, name, f"{100 * s['attainment']:.0f} %",
                      f"{100 * s['exact_match']:.0f} %", s["forwards_per_answer"], s["mean_threshold"],
                      s["thresholds_used"], s["p50_latency_s"])
    print("\npooled over the rounds: SLO attainment, mean p50 latency, rounds within 5 points of fixed_0.9 or above")
    for name in configs(rounds[0]):
        att = [rd[name]["attainment"] for rd in rounds]
        close = sum(a >= rd["fixed_0.9"]["attainment"] - 0.05 for a, rd in zip(att, rounds))
        print(f"  {name:15s} {100 * statistics.mean(att):5.1f} %  "
              f"{statistics.mean(rd[name]['p50_latency_s'] for rd in rounds):.3f} s  {close} of {len(rounds)}")
    if waves_too:
        print("\ndemo-task answers finished in waves (end of wave in s, answers), per round and configuration")
        for rd in rounds:
            for name in configs(rd):
                print(f"  round {rd['round']}, SLO {rd['slo_ms'] / 1e3:.3f} s, {name:15s} "
                      f"{100 * rd[name]['attainment']:3.0f} %: {rd[name]['task_waves'][:5]}")
    if per_request:
        for rd in rounds:
            print(f"\nround {rd['round']}, slo policy, SLO {rd['slo_ms'] / 1e3:.2f} s: latency (s), task, forwards, "
                  "thresholds")
            for o in rd["policy_requests"]:
                print(f"  {o['latency_s']:.2f}  {o['task']:8s}  {o['forwards']:3d}  {o['thresholds']}")


def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: the embedded demo model)")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quantile", type=float, default=0.3)
    ap.add_argument("--scheduling-policy", default="deadline", choices=("fcfs", "deadline"))
    ap.add_argument("--fixed-low", type=float, default=None,
                    help="also run every round at this fixed threshold (e.g. 0.5), against the same SLO")
    ap.add_argument("--per-request", action="store_true",
                    help="also list the policy's requests of every round: latency, task, forwards, thresholds")
    ap.add_argument("--waves", action="store_true",
                    help="also print, per round and configuration, when the demo tasks finished: (end of wave "
                         "(s), answers in it), the first five waves")
    ap.add_argument("--from-json", help="print the tables of a saved run (--json) instead of running one")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.from_json:
        return report(json.loads(Path(a.from_json).read_text()), a.waves, a.per_request)
    with tempfile.TemporaryDirectory() as tmp:
        r = run(a.model, a.requests, a.rounds, a.quantile, Path(tmp), ("--scheduling-policy", a.scheduling_policy),
                low=a.fixed_low)
    report(r, a.waves, a.per_request)
    if a.json:
        write_json(a.json, r, indent=2)


if __name__ == "__main__":
    main()
