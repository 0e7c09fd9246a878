"""The ray launch backend against mp on this machine (issue 29): each server's start-up time (the
command to /health 200), and at batch 1 the latency the served path adds per step over the
offline API (http_vs_offline.py's paired measurement: one request at a time, offline and over
HTTP alternately, token-identical). Ray runs a one-node cluster started here first (its own
start-up reported apart); per-iteration messages go over our socket (ray) or pipes (mp).

    python bench/ray_vs_mp.py [--model DIR] [--sequential 24] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")    # loopback only (tests/executor/test_ray.py)

import torch  # noqa: E402

from dllm_server import LLM  # noqa: E402
from dllm_server.server_process import serve  # noqa: E402
from dllm_server.model.tiny import make_tiny_model  # noqa: E402
from common import plain_id_offset  # noqa: E402
from http_vs_offline import sequential, workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--sequential", type=int, default=24)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    from ray.cluster_utils import Cluster
    path = a.model or str(make_tiny_model(tempfile.mkdtemp(), arch="llada", hidden=256, layers=4, heads=4, mlp=704))
    t = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 80 * 2**20,
                                                             "node_ip_address": "127.0.0.1"})
    cluster_s = time.perf_counter() - t
    prompts = workload(a.sequential, a.max_tokens, offset=plain_id_offset(path))
    torch.set_num_threads(1)
    llm = LLM(path, dtype="float32")
    flags = {"mp": [], "ray": ["--distributed-executor-backend", "ray", "--ray-address", cluster.address]}
    rows = {k: [] for k in flags}
    try:
        for _ in range(a.rounds):
            for name, extra in flags.items():
                t = time.perf_counter()
                server = serve(path, "--dtype", "float32", "--threads-per-worker", "1", *extra,
                               log_path=Path(tempfile.mkdtemp()) / "server.log", timeout_s=300)
                start_s = time.perf_counter() - t
                try:
                    seq = sequential(server.url, llm, prompts, a.max_tokens, a.block)
                finally:
                    server.stop(timeout=60)
                rows[name].append((start_s, seq))
    finally:
        cluster.shutdown()
    print(f"model {path}; batch 1, {a.sequential} requests of {a.max_tokens} tokens in blocks of {a.block}, "
          f"{a.rounds} rounds, backends alternating; a one-node Ray cluster started here in {cluster_s:.1f} s\n")
    print("| backend | server start-up (s) | offline latency (ms) | served latency (ms) | served path adds per "
          "step (ms) | per block (ms) |\n|---|---|---|---|---|---|")
    for name, rs in rows.items():
        med = lambda f: statistics.median(f(r) for r in rs)   # noqa: E731
        print(f"| {name} | {med(lambda r: r[0]):.1f} | {med(lambda r: r[1]['offline_ms']):.1f} | "
              f"{med(lambda r: r[1]['http_ms']):.1f} | {med(lambda r: r[1]['extra_ms_per_step']):.3f} | "
              f"{med(lambda r: r[1]['extra_ms_per_block']):.2f} |")


if __name__ == "__main__":
    main()
