"""What glibc's defaults cost a CPU forward, and what `--cpu-malloc-hold-mb` gives back: 32 dual-cache
block steps on the demo model, each setting in a fresh process, alternating, with minor page faults.

    python -m bench.malloc_hold [--rounds 2] [--model DIR] [--json out.json]
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.harness import Report, parser

ROOT = Path(__file__).resolve().parents[1]

# The forward of 32 block steps (prompt 96, block 32, canvas 224, fp32, 1 thread), 30 times after 5
# untimed, in a child run from the repository root (its `bench` package on the path); the hold is
# set before anything allocates.
CHILD = """
import json, resource, statistics, sys, torch
from dllm_server.worker.memory import hold_freed_memory
held = hold_freed_memory(int(sys.argv[1]))
from bench.harness import samples_s, step_items
from dllm_server import LLM
torch.set_num_threads(1)
llm = LLM(sys.argv[2] or None, dtype="float32")
items = step_items(llm, 32, 96, 32, 224, "p")
for _ in range(5):
    llm.runner.forward(items)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ts = samples_s(lambda: llm.runner.forward(items), 30)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 30
print(json.dumps({"held": held, "median_ms": 1e3 * statistics.median(ts), "min_ms": 1e3 * min(ts), "faults": faults}))
"""


def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: the embedded demo model)", json_out=True)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from dllm_server.config import ServerConfig
    mb = ServerConfig().cpu_malloc_hold_mb
    report = Report(args.json)
    table = report.table(["round", "malloc", ("forward, batch 32: median (ms)", ".2f"), ("min (ms)", ".2f"),
                          ("minor page faults per forward", ".0f")])
    for r in range(1, args.rounds + 1):
        for hold in ((0, mb) if r % 2 else (mb, 0)):
            out = subprocess.run([sys.executable, "-c", CHILD, str(hold), args.model or ""], capture_output=True,
                                 text=True, check=True, cwd=ROOT)
            m = json.loads(out.stdout.splitlines()[-1])
            table.row(r, f"held ({hold} MB)" if m["held"] else "glibc defaults", m["median_ms"], m["min_ms"],
                      m["faults"])
    report.save()


if __name__ == "__main__":
    main()
