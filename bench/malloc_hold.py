"""What glibc's defaults cost a CPU forward, and what `--cpu-malloc-hold-mb` gives back: the
forward of 32 dual-cache block steps on the demo model (prompt 96, block 32, canvas 224, fp32,
1 thread), timed 30 times in a fresh process with glibc's defaults and with freed memory held
(worker/memory.py hold_freed_memory), alternating, with the minor page faults per forward.

    python bench/malloc_hold.py [--rounds 2] [--model DIR]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, statistics, sys, time, torch
from dllm_server.worker.memory import hold_freed_memory
held = hold_freed_memory(int(sys.argv[1]))
from dllm_server import LLM
from dllm_server.worker.runner import ForwardItem, fed_range
torch.set_num_threads(1)
llm = LLM(sys.argv[2] or None, dtype="float32")
core, a = llm.core, llm.args
items = []
for b in range(32):
    canvas = torch.full((224,), a.mask_id, dtype=torch.int64)
    canvas[:96] = 65 + b % 26
    alloc = core.pool.allocate(f"p{b}", 224)
    lo, hi = fed_range("dual", False, 96, 128, 224, a.logit_shift)
    llm.runner.forward([ForwardItem(canvas, alloc, 0, 224, 96, 128)])
    items.append(ForwardItem(canvas, alloc, lo, hi, 96, 128))
for _ in range(5):
    llm.runner.forward(items)
f0, ts = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, []
for _ in range(30):
    t = time.perf_counter()
    llm.runner.forward(items)
    ts.append(time.perf_counter() - t)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 30
print(json.dumps({"held": held, "median_ms": 1e3 * statistics.median(ts), "min_ms": 1e3 * min(ts), "faults": faults}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="")
    args = ap.parse_args()
    from dllm_server.config import ServerConfig
    mb = ServerConfig().cpu_malloc_hold_mb
    print(f"| round | malloc | forward, batch 32: median (ms) | min (ms) | minor page faults per forward |\n|---|---|---|---|---|")
    for r in range(1, args.rounds + 1):
        for hold in ((0, mb) if r % 2 else (mb, 0)):
            out = subprocess.run([sys.executable, "-c", CHILD, str(hold), args.model], capture_output=True, text=True,
                                 check=True, cwd=ROOT)
            m = json.loads(out.stdout.splitlines()[-1])
            name = f"held ({hold} MB)" if m["held"] else "glibc defaults"
            print(f"| {r} | {name} | {m['median_ms']:.2f} | {m['min_ms']:.2f} | {m['faults']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
