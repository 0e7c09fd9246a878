"""Per-forward cost of two checkpoints side by side in one process: the forward of B dual-cache
block steps (bench/hot_path.py's measure) for each model in turn, alternating over rounds so both
see the same machine state. For a model swap that must not change the cost per forward (the
demo model v3 against v2: docs/benchmarks.md section 13).

    python bench/forward_cost.py --model training/demo-v2/model --model src/dllm_server/assets/demo-model
"""
from __future__ import annotations

import argparse
import statistics

import torch

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_server import LLM  # noqa: E402
from common import step_items  # noqa: E402
from hot_path import forward_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="a checkpoint (give two or more)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=96)
    ap.add_argument("--block", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    llms = [LLM(m, dtype="float32", block_length=a.block) for m in a.model]
    canvas_len = a.prompt + 4 * a.block
    ms: dict[tuple[int, int], list[float]] = {}
    for _ in range(a.rounds):
        for b in a.batch:
            for k, llm in enumerate(llms):
                items = step_items(llm, b, a.prompt, a.block, canvas_len, f"b{b}_")
                ms.setdefault((k, b), []).append(forward_ms(llm, items, max(10, 320 // b)))
                for i in range(b):
                    llm.core.pool.free(f"b{b}_{i}")
    print(f"dual-cache block steps: prompt {a.prompt}, block {a.block}, canvas {canvas_len}; float32, "
          f"{a.threads} thread(s); median of {a.rounds} alternating rounds (each a median of repeats)\n")
    print("| batch | " + " | ".join(f"{m} (ms)" for m in a.model) + " | ratio, last / first |")
    print("|---|" + "---|" * (len(a.model) + 1))
    for b in a.batch:
        med = [statistics.median(ms[(k, b)]) for k in range(len(llms))]
        print(f"| {b} | " + " | ".join(f"{v:.2f}" for v in med) + f" | {med[-1] / med[0]:.3f} |")


if __name__ == "__main__":
    main()
