"""One configuration of bench/slo.py's workload at one Poisson rate, `--runs` times in a row on
one fresh server (after a short warm-up at 1 req/s): SLO attainment, mean latency and mean block
threshold per run. For side-by-side checks of one change at one load (run it once per code
version, e.g. with PYTHONPATH pointing at a worktree of the older commit), without slo.py's
capacity search and quality pass.

    python bench/slo_at_rate.py --config slo --rate 9.75 --slo-ms 1647
    python bench/slo_at_rate.py --config 0.5 --rate 9.75 --slo-ms 1647     # fixed threshold 0.5
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import dllm_server
from dllm_server.server_process import serve
from quality import load_task
from slo import run_at, task_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="slo", help="'slo' (--threshold-policy slo, load control on) or a fixed "
                                                    "threshold such as 0.5")
    ap.add_argument("--rate", type=float, required=True, help="requests per second (Poisson)")
    ap.add_argument("--slo-ms", type=float, required=True)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--task-share", type=float, default=0.5, help="demo-task questions among the requests")
    a = ap.parse_args()
    flags = ["--threshold-policy", "slo"] if a.config == "slo" else ["--threshold", a.config]
    specs = task_workload(load_task("demo"), a.requests, 64, a.task_share, 0)
    print(f"code from {Path(dllm_server.__file__).parent}; config {a.config}, {a.rate} req/s, SLO {a.slo_ms} ms")
    with tempfile.TemporaryDirectory() as tmp:
        s = serve(None, "--dtype", "float32", "--threads-per-worker", "1", "--max-waiting-requests", "4096", *flags,
                  log_path=Path(tmp) / "server.log")
        try:
            asyncio.run(run_at(s.url, specs[:6], 1.0, a.slo_ms, 3))          # warm-up at a light load
            for k in range(a.runs):
                sm = asyncio.run(run_at(s.url, specs, a.rate, a.slo_ms, 1 + k))["summary"]
                print(f"run {k}: attainment {100 * sm['slo']['attainment']:.0f} %, mean latency "
                      f"{sm['e2el_ms']['mean']:.0f} ms, mean threshold {sm['slo']['mean_threshold']:.3f}", flush=True)
        finally:
            s.stop()


if __name__ == "__main__":
    main()
