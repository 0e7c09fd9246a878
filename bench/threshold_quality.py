"""What a lower threshold costs in quality, per model, offline: every prompt of bench/slo.py decoded
greedy at each threshold, against the same prompt at threshold 0.99 (bench/quality.py's measures:
token agreement and the model's own pseudo log-likelihood of the answer), with the forwards each
answer took. The price list behind bench/slo.py's "mean threshold" column, for models whose answers
do change with the threshold.

    python bench/threshold_quality.py --model DIR [--model DIR2 ...] [--thresholds 0.95,0.9,0.8,0.7,0.6,0.5]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from dllm_server import LLM, SamplingParams
from dllm_server.checkpoint import embedded_model_path
from quality import agreement, pseudo_log_likelihood
from slo import PROMPTS


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="checkpoint folder (repeatable); default: the demo model")
    ap.add_argument("--thresholds", type=lambda t: [float(x) for x in t.split(",")],
                    default=[0.95, 0.9, 0.8, 0.7, 0.6, 0.5])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()
    report = {}
    for model in a.model or [str(embedded_model_path())]:
        report[model] = measure(model, a.thresholds, a.max_tokens)
    print(f"{len(PROMPTS)} prompts of bench/slo.py, greedy, max_tokens {a.max_tokens}; reference: threshold 0.99\n")
    print("| model | threshold | agreement with 0.99 | pseudo log-lik | forwards per answer | distinct answers "
          "| median words |")
    print("|---|---|---|---|---|---|---|")
    for model, rows in report.items():
        for r in rows:
            print(f"| {Path(model).name} | {r['threshold']:g} | {r['agreement']:.3f} | {r['pll']:.3f} | "
                  f"{r['forwards']:.1f} | {r['distinct']} | {r['words']:g} |")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
