"""Why a CPU worker's memory grew in the long soak, and what bounds it (docs/reliability.md, "Worker
memory"): RSS growth of bf16 matmuls of many shapes per kernel-cache bound, and of the offline LLM per setting.

    python -m bench.worker_memory [--batches 40] [--json out.json]
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.harness import Report, parser, plain_ids

# Each configuration in a fresh process: the caches' capacity is read from the environment once.
# 1. bf16 matmuls of 600 distinct token counts (shuffled), as a worker's packed batches of mixed
# traffic have: RSS growth after the first 150, per kernel-cache capacity.
MATMULS = """
import json, random, sys, time, torch, torch.nn.functional as F
from dllm_server.worker.memory import bound_kernel_caches
bound_kernel_caches(int(sys.argv[1]))
torch.set_num_threads(1)
def rss():
    return next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
w = torch.randn(704, 256, dtype=torch.bfloat16)
shapes = list(range(1, 601))
random.Random(0).shuffle(shapes)
t0 = time.perf_counter()
for i, t in enumerate(shapes):
    F.linear(torch.randn(t, 256, dtype=torch.bfloat16), w)
    if i == 150:
        r0 = rss()
print(json.dumps({"growth_mb": rss() - r0, "seconds": time.perf_counter() - t0}))
"""

# 2. The offline LLM on the demo model (CPU, one thread), batches of 1 to 6 prompts of mixed lengths
# and answer lengths: RSS after batch 5 and at the end.
OFFLINE = """
import json, random, sys, time, torch
from dllm_server import LLM, SamplingParams
from dllm_server.worker.memory import bound_kernel_caches, glibc_malloc_trim
entries, trim, dtype, batches = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3], int(sys.argv[4])
offset = int(sys.argv[5])                         # harness.plain_ids: past a BPE's special ids
bound_kernel_caches(entries)
torch.set_num_threads(1)
def rss():
    return next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
llm = LLM(model=None, dtype=dtype)
trimmer = glibc_malloc_trim() if trim else None
rng = random.Random(0)
def ids(k):
    return [rng.randrange(250) + offset for _ in range(k)]
t0 = time.perf_counter()
for b in range(batches):
    n = rng.randint(1, 6)
    prompts = [{"prompt_token_ids": ids(rng.choice([5, 15, 25, 40, 60, 120, 400]))} for _ in range(n)]
    llm.generate(prompts, [SamplingParams(max_tokens=rng.choice([8, 16, 32, 64]), seed=rng.randrange(1 << 30))
                           for _ in range(n)])
    if trimmer:
        trimmer()
    if b == 5:
        r0 = rss()
print(json.dumps({"after_5_mb": r0, "end_mb": rss(), "seconds": time.perf_counter() - t0}))
"""


def run(code: str, *args) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=True,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = parser(__doc__, json_out=True)
    ap.add_argument("--batches", type=int, default=40)
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}\n")
    report = Report(args.json)
    table = report.table(["kernel-cache entries (each cache)", "RSS growth, shapes 150 -> 600", ("seconds", ".1f")])
    for entries in (0, 16, 64, 256):
        r = run(MATMULS, entries)
        table.row(entries or "library default (1024)", f"{r['growth_mb']:+.1f} MB", r["seconds"])
    print()
    table = report.table([f"offline LLM, demo model, {args.batches} batches", "RSS after batch 5 -> end", "growth",
                          ("seconds", ".0f")])
    for label, entries, trim, dtype in (("bf16, library defaults", 0, 0, "bfloat16"),
                                        ("bf16, caches at 64", 64, 0, "bfloat16"),
                                        ("bf16, caches at 64 + malloc_trim per batch", 64, 1, "bfloat16"),
                                        ("float32 (no oneDNN matmuls)", 0, 0, "float32")):
        r = run(OFFLINE, entries, trim, dtype, args.batches, plain_ids(None))
        a, b = r["after_5_mb"], r["end_mb"]
        table.row(label, f"{a:.1f} -> {b:.1f} MB", f"{100 * (b - a) / a:+.1f} %", r["seconds"])
    report.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
