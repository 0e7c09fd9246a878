"""What a lower threshold costs in quality, per model, offline: bench/slo.py's prompts at each threshold
against threshold 0.99 (agreement, pseudo log-likelihood, forwards); with --task, accuracy per task.

    python -m bench.threshold_quality --model DIR [--model DIR2 ...] [--thresholds 0.95,0.9,0.8,0.7,0.6,0.5]
    python -m bench.threshold_quality --model DIR --task demo [--limit 5] [--json out.json]
"""
from __future__ import annotations

import statistics
from pathlib import Path

from bench.harness import Table, parser, write_json
from bench.quality import agreement, load_task, pseudo_log_likelihood, task_scores
from bench.slo import PROMPTS
from dllm_server import LLM, SamplingParams
from dllm_server.checkpoint import embedded_model_path


def measure(model: str, thresholds: list[float], max_tokens: int) -> list[dict]:
    llm = LLM(model)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    prompt_ids = [llm.tokenizer.apply_chat_template(c) for c in chats]

    def run(tau: float):
        return llm.chat(chats, SamplingParams(max_tokens=max_tokens, threshold=tau, temperature=0.0))

    refs = [o.token_ids for o in run(0.99)]
    rows = []
    for tau in [0.99] + thresholds:
        outs = run(tau)
        rows.append({"threshold": tau,
                     "agreement": statistics.mean(agreement(o.token_ids, r) for o, r in zip(outs, refs)),
                     "pll": statistics.mean(pseudo_log_likelihood(llm, p, o.token_ids)
                                            for p, o in zip(prompt_ids, outs) if o.token_ids),
                     "forwards": statistics.mean(o.stats.num_forwards for o in outs),
                     "distinct": len({o.text for o in outs}),
                     "words": statistics.median(len(o.text.split()) for o in outs)})
    return rows


TASK_THRESHOLDS = [0.99, 0.95, 0.9, 0.7, 0.5, 0.3]


def first(task: list[dict], limit: int | None) -> list[dict]:
    """The first `limit` items of each task (of the file, for a GSM8K-style one)."""
    if limit is None:
        return list(task)
    seen: dict[str, int] = {}
    out = []
    for item in task:
        k = item.get("task", "all")
        seen[k] = seen.get(k, 0) + 1
        if seen[k] <= limit:
            out.append(item)
    return out


def measure_task(model: str, items: list[dict], thresholds: list[float], max_tokens: int) -> list[dict]:
    llm = LLM(model)
    chats = [[{"role": "user", "content": it["question"]}] for it in items]
    rows = []
    for tau in thresholds:
        outs = llm.chat(chats, SamplingParams(max_tokens=max_tokens, threshold=tau, temperature=0.0))
        scores = task_scores(zip(items, (o.text for o in outs)))
        forwards: dict[str, list[int]] = {}
        for it, o in zip(items, outs):
            forwards.setdefault(it.get("task", "all"), []).append(o.stats.num_forwards)
        for t, entry in scores["per_task"].items():
            entry["forwards"] = statistics.mean(forwards[t])
        rows.append({"threshold": tau, "accuracy": scores["accuracy"], "requests": scores["requests"],
                     "forwards": statistics.mean(o.stats.num_forwards for o in outs), "per_task": scores["per_task"]})
    return rows


def print_task_table(report: dict, task: str, max_tokens: int) -> None:
    rows = next(iter(report.values()))
    tasks = list(rows[0]["per_task"])
    print(f"{rows[0]['requests']} questions of {task}, greedy, offline, no load, max_tokens {max_tokens}; "
          "per task: accuracy / forwards per answer\n")
    table = Table(["model", ("threshold", "g"), ("accuracy", ".3f"), ("forwards per answer", ".1f"), *tasks])
    for model, rows in report.items():
        for r in rows:
            table.row(Path(model).name, r["threshold"], r["accuracy"], r["forwards"],
                      *(f"{r['per_task'][t]['accuracy']:.2f} / {r['per_task'][t]['forwards']:.1f}" for t in tasks))


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--model", action="append", help="checkpoint folder (repeatable); default: the demo model")
    ap.add_argument("--thresholds", type=lambda t: [float(x) for x in t.split(",")], default=None,
                    help="besides the reference 0.99 (default 0.95,0.9,0.8,0.7,0.6,0.5); with --task: the "
                         f"thresholds to price (default {','.join(map(str, TASK_THRESHOLDS))})")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--task", help="GSM8K-style JSONL or 'demo' (the shipped demo-task set): accuracy instead")
    ap.add_argument("--limit", type=int, default=None, help="with --task: the first N questions of each task")
    ap.add_argument("--json", help="also write every figure here")
    a = ap.parse_args()
    models = a.model or [str(embedded_model_path())]
    if a.task:
        items = first(load_task(a.task), a.limit)
        report = {m: measure_task(m, items, a.thresholds or TASK_THRESHOLDS, a.max_tokens) for m in models}
        print_task_table(report, a.task, a.max_tokens)
    else:
        report = {m: measure(m, a.thresholds or [0.95, 0.9, 0.8, 0.7, 0.6, 0.5], a.max_tokens) for m in models}
        print(f"{len(PROMPTS)} prompts of bench/slo.py, greedy, max_tokens {a.max_tokens}; reference: threshold 0.99\n")
        table = Table(["model", ("threshold", "g"), ("agreement with 0.99", ".3f"), ("pseudo log-lik", ".3f"),
                       ("forwards per answer", ".1f"), "distinct answers", ("median words", "g")])
        for model, rows in report.items():
            for r in rows:
                table.row(Path(model).name, r["threshold"], r["agreement"], r["pll"], r["forwards"], r["distinct"],
                          r["words"])
    if a.json:
        write_json(a.json, report)


if __name__ == "__main__":
    main()
