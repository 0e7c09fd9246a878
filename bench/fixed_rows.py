"""The cost of forcing batch invariance (ServerConfig.fixed_matmul_rows): block steps and prefills with one
matmul per projection and with fixed-row matmuls, rounds interleaved, and whether each is batch-invariant.

    python -m bench.fixed_rows [--model DIR] [--rows 0 16 32 64] [--threads 1] [--rounds 3] [--json out.json]
"""
from __future__ import annotations

import statistics

import torch

from bench.harness import Report, median_time_s, parser, step_items
from dllm_server import LLM
from dllm_server.worker import determinism as D
from dllm_server.worker.runner import ForwardItem


def timed(fn, reps: int) -> float:
    return 1e3 * median_time_s(fn, reps)


def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: the embedded demo model)", threads=1, json_out=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[0, 16, 32, 64])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prefill", type=int, nargs="+", default=[100, 224, 1000])
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
    report = Report(a.json)
    table = report.table(["forward", *("one matmul" if r == 0 else f"fixed {r} rows" for r in a.rows)])
    for c in cases:
        base = statistics.median(times[(c, a.rows[0])])
        table.row(c, *(f"{statistics.median(times[(c, r)]):.2f}" + ("" if r == a.rows[0] else
                       f" ({statistics.median(times[(c, r)]) / base:.2f}x)") for r in a.rows))
    table.row("batch-invariant here (self-check)", *("yes" if verdict[r] else "no" for r in a.rows))
    report.save()


if __name__ == "__main__":
    main()
