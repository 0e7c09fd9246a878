"""The cost of forcing batch invariance (ServerConfig.fixed_matmul_rows): the same forwards with
one matmul per projection and with fixed-row matmuls of several sizes, side by side in one run
(rounds interleaved), on the demo model by default. Forwards: dual-cache block steps of B seated
requests (B x block rows) and full-canvas prefills. Also whether each setting is batch-invariant
here (worker/determinism.py).

    python bench/fixed_rows.py [--model DIR] [--rows 0 16 32 64] [--threads 1] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_server import LLM  # noqa: E402
from dllm_server.worker import determinism as D  # noqa: E402
from dllm_server.worker.runner import ForwardItem  # noqa: E402
from common import median_time_s, step_items  # noqa: E402  (bench/, the script's folder)


def timed(fn, reps: int) -> float:
    return 1e3 * median_time_s(fn, reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--rows", type=int, nargs="+", default=[0, 16, 32, 64])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prefill", type=int, nargs="+", default=[100, 224, 1000])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    llm = LLM(a.model, dtype="float32", block_length=32)
    model, pool, block, prompt = llm.runner.model, llm.core.pool, 32, 96
    cases = {}
    for b in a.batch:
        items = step_items(llm, b, prompt, block, prompt + 4 * block, f"b{b}_")
        cases[f"block step, batch {b} ({b * block} rows)"] = lambda items=items: llm.runner.forward(items)
    for n in a.prefill:
        canvas = torch.full((n,), llm.args.mask_id, dtype=torch.int64)
        canvas[: n // 2] = torch.arange(n // 2) % 200 + 10
        alloc = pool.allocate(f"p{n}", n)
        item = [ForwardItem(canvas, alloc, 0, n, n // 2, n // 2 + block)]
        cases[f"prefill, canvas {n}"] = lambda item=item: llm.runner.forward(item)
    times = {(c, r): [] for c in cases for r in a.rows}
    verdict = {}
    for _ in range(a.rounds):
        for r in a.rows:
            D.set_fixed_rows(model, r)
            verdict[r] = D.check_model(model, block, 64).holds
            for c, fn in cases.items():
                times[(c, r)].append(timed(fn, 10))
    print(f"model {llm.path}, float32, {a.threads} thread(s); median of {a.rounds} interleaved rounds (each a median "
          "of 10 forwards), ms\n")
    print("| forward | " + " | ".join("one matmul" if r == 0 else f"fixed {r} rows" for r in a.rows) + " |")
    print("|---|" + "---|" * len(a.rows))
    for c in cases:
        base = statistics.median(times[(c, a.rows[0])])
        cells = [f"{statistics.median(times[(c, r)]):.2f}" + ("" if r == a.rows[0] else
                 f" ({statistics.median(times[(c, r)]) / base:.2f}x)") for r in a.rows]
        print(f"| {c} | " + " | ".join(cells) + " |")
    print("| batch-invariant here (self-check) | " + " | ".join("yes" if verdict[r] else "no" for r in a.rows) + " |")


if __name__ == "__main__":
    main()
