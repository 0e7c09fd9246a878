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
sys.path.insert(0, "bench")
from common import step_items
from dllm_server import LLM
torch.set_num_threads(1)
llm = LLM(sys.argv[2] or None, dtype="float32")
items = step_items(llm, 32, 96, 32, 224, "p")
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
