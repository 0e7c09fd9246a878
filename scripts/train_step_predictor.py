"""Train the SLO policy's step predictor from traces our own engine records, evaluate it on
held-out requests, and write the artefact the server loads (step_predictor.json next to the
checkpoint).

1. Collect (unless --traces is given): the real engine in trace mode decodes a mixed workload in
   which every request commits at one candidate threshold throughout (drawn at random), so the
   traces cover each candidate.
2. Train three gradient-boosted regressors (scikit-learn's HistGradientBoostingRegressor, the
   `predictor` extra) on every step and admission row of 75 % of the requests: the forwards the
   current block still needs, the forwards of the later blocks, and how many later blocks.
3. Evaluate remaining forwards (current block + later blocks) on the other 25 %: at admission
   (one-shot) and after every step (online), for the trees and for the simple estimator, as MAE
   and R^2; print the table.

    python scripts/train_step_predictor.py --model src/dllm_server/assets/demo-model --requests 400
    python scripts/train_step_predictor.py --model tiny --requests 200 --out /tmp/tiny-predictor.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from dllm_server import SamplingParams
from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine
from dllm_server.policy.predictor import ARTEFACT, SimpleEstimator, TreePredictor, export_hist_gbm
from dllm_server.policy.progress import FEATURES, TARGETS

CUES = ["Good morrow, my lord. What news?", "Tell me a story.", "Who art thou?", "What is love?",
        "Wherefore art thou sad?", "Speak, fair maid.", "How fares the king?", "Is the queen well?",
        "What say you to this?", "Where is your master?", "Why do you weep?", "Shall we go hunt?",
        "What hour is it?", "Come, tell me true.", "Whence came you?", "Will you walk with me?",
        "What think you of the duke?", "I pray you, sir, be patient.", "O, what a night is this!",
        "Give me your hand.", "Hast thou no mercy?", "Let us to the court.", "What means this noise?",
        "I love thee not.", "Farewell, my friend."]
TEXTS = ["ROMEO. But soft, what light", "KING. Now is the winter of our", "HAMLET. To be, or not to be,",
         "The quality of mercy is", "All the world's a stage, and", "Friends, Romans, countrymen,"]


def workload(n: int, seed: int, candidates: tuple[float, ...], task_share: float = 0.4) -> list:
    """Chat cues, plain-text prompts and (`task_share`) demo-task questions drawn fresh from the task
    generators (dllm_server.demo_tasks; copy lines from the shipped evaluation set's), each
    committing at one random candidate threshold throughout."""
    from dllm_server import demo_tasks as T
    rng = random.Random(seed)
    lines = [i.answer for i in T.load_eval(tasks=["copy"])]
    out = []
    for i in range(n):
        params = SamplingParams(max_tokens=rng.choice([32, 64, 96, 128]), temperature=rng.choice([0.0, 0.7]),
                                seed=i, threshold=rng.choice(candidates))
        kind = rng.random()
        if kind < task_share:
            item = T.make(rng.choice(T.TASKS), rng, lines)
            params = SamplingParams(max_tokens=64, temperature=0.0, seed=i, threshold=params.threshold)
            out.append(({"messages": [{"role": "user", "content": item.question}]}, params))
        elif kind < task_share + (1 - task_share) * 0.7:
            out.append(({"messages": [{"role": "user", "content": rng.choice(CUES)}]}, params))
        else:
            out.append(({"prompt": rng.choice(TEXTS)}, params))
    return out


async def collect(model: str, trace_dir: Path, n: int, seed: int, concurrency: int) -> None:
    config = ServerConfig(model=model, dtype="float32", threads_per_worker=1, trace_dir=str(trace_dir))
    engine = AsyncEngine(config)
    await engine.start()
    sem = asyncio.Semaphore(concurrency)

    async def one(req, params):
        async with sem:
            return await engine.run(params=params, **({"messages": req["messages"]} if "messages" in req
                                                      else {"prompt": req["prompt"]}))
    try:
        t = time.perf_counter()
        outs = await asyncio.gather(*[one(r, p) for r, p in workload(n, seed, config.candidate_thresholds)])
        print(f"collected {len(outs)} requests in {time.perf_counter() - t:.0f} s")
    finally:
        await engine.shutdown(0)


def load_rows(trace_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X, Y [targets], is_admission, request hash) over every admit and step row of finished requests."""
    steps, ends = [], {}
    for f in sorted(trace_dir.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            (ends.__setitem__(r["rid"], r) if r["kind"] == "end" else steps.append(r))
    xs, ys, admit, group = [], [], [], []
    for r in steps:
        e = ends.get(r["rid"])
        if e is None or e["finish"] not in ("stop", "length"):
            continue
        spb = e["steps_per_block"]
        b = 0 if r["kind"] == "admit" else r["block"]
        if b >= len(spb):
            continue
        done_in_block = 0 if r["kind"] == "admit" else r["step"] + 1
        ys.append([spb[b] - done_in_block, sum(spb[b + 1:]), len(spb) - b - 1])
        xs.append(r["x"])
        admit.append(r["kind"] == "admit")
        group.append(zlib.crc32(r["rid"].encode()) % 100)
    return np.asarray(xs, float), np.asarray(ys, float), np.asarray(admit), np.asarray(group)


def scores(pred: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    mae = float(np.abs(pred - true).mean())
    ss = float(((true - true.mean()) ** 2).sum())
    return mae, 1 - float(((true - pred) ** 2).sum()) / ss if ss else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="src/dllm_server/assets/demo-model", help="checkpoint folder, or 'tiny'")
    ap.add_argument("--traces", help="use these traces instead of collecting")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help=f"artefact path (default: {ARTEFACT} in the model folder)")
    ap.add_argument("--max-iter", type=int, default=60)
    ap.add_argument("--max-depth", type=int, default=6, help="shallow trees: the server evaluates them per tick")
    args = ap.parse_args()
    try:
        from sklearn.ensemble import HistGradientBoostingRegressor
    except ImportError:
        raise SystemExit("scikit-learn is needed to train: pip install 'dllm-server[predictor]'")
    model = args.model
    if model == "tiny":
        from dllm_server.model.tiny import make_tiny_model
        model = str(make_tiny_model(tempfile.mkdtemp(), arch="llada", seed=0))
    trace_dir = Path(args.traces) if args.traces else Path(tempfile.mkdtemp(prefix="dllm-traces-"))
    if not args.traces:
        asyncio.run(collect(model, trace_dir, args.requests, args.seed, args.concurrency))
    x, y, admit, group = load_rows(trace_dir)
    held = group >= 75
    print(f"{len(x)} rows ({int(admit.sum())} at admission) from {trace_dir}; held out: {int(held.sum())} rows")
    models = {}
    for j, target in enumerate(TARGETS):
        m = HistGradientBoostingRegressor(max_iter=args.max_iter, learning_rate=0.12, max_leaf_nodes=31,
                                          max_depth=args.max_depth, min_samples_leaf=20, random_state=args.seed)
        models[target] = m.fit(x[~held], y[~held, j])
    artefact = {"features": list(FEATURES), "targets": {t: export_hist_gbm(m) for t, m in models.items()},
                "meta": {"model": Path(model).name, "requests": args.requests, "rows": int(len(x)),
                         "trained": time.strftime("%Y-%m-%d")}}
    out = Path(args.out) if args.out else Path(model) / ARTEFACT
    out.write_text(json.dumps(artefact, separators=(",", ":")))
    trees = TreePredictor.load(out)
    true = y[:, 0] + y[:, 1]
    print(f"\nartefact: {out} ({out.stat().st_size / 1024:.0f} KiB)\n")
    print("| predictor | when | held-out rows | MAE remaining forwards | R^2 |")
    print("|---|---|---|---|---|")
    for name, pred in (("gradient-boosted trees", trees), ("simple estimator", SimpleEstimator())):
        for when, sel in (("at admission (one-shot)", held & admit), ("after every step (online)", held & ~admit)):
            p = pred.predict(x[sel])
            mae, r2 = scores(p["block_rem"] + p["fut_forwards"], true[sel])
            print(f"| {name} | {when} | {int(sel.sum())} | {mae:.2f} | {r2:.3f} |")


if __name__ == "__main__":
    main()
