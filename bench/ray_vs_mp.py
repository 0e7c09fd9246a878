"""The ray launch backend against mp (issue 29): each server's start-up time, and at batch 1 the latency
the served path adds per step (bench.http_vs_offline's paired measurement); ray on a one-node cluster.

    python -m bench.ray_vs_mp [--model DIR] [--sequential 24] [--rounds 2] [--json out.json]
"""
from __future__ import annotations

import os
import statistics
import tempfile

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")    # loopback only (tests/executor/test_ray.py)

import torch  # noqa: E402

from bench.harness import Report, Timer, parser, server  # noqa: E402
from bench.http_vs_offline import prompts_for, sequential  # noqa: E402
from dllm_server import LLM  # noqa: E402
from dllm_server.model.tiny import make_tiny_model  # noqa: E402


def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: a random 4-layer d=256 LLaDA)", json_out=True)
    ap.add_argument("--sequential", type=int, default=24)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    from ray.cluster_utils import Cluster
    path = a.model or str(make_tiny_model(tempfile.mkdtemp(), arch="llada", hidden=256, layers=4, heads=4, mlp=704))
    with Timer() as t:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 80 * 2**20,
                                                                 "node_ip_address": "127.0.0.1"})
    cluster_s = t.s
    prompts = prompts_for(path, a.sequential)
    torch.set_num_threads(1)
    llm = LLM(path, dtype="float32")
    flags = {"mp": [], "ray": ["--distributed-executor-backend", "ray", "--ray-address", cluster.address]}
    rows = {k: [] for k in flags}
    try:
        for _ in range(a.rounds):
            for name, extra in flags.items():
                # the start-up: the command to /health 200
                with Timer() as t, server(path, "--dtype", "float32", "--threads-per-worker", "1", *extra,
                                          timeout_s=300) as s:
                    start_s = t.s
                    seq = sequential(s.url, llm, prompts, a.max_tokens, a.block)
                rows[name].append((start_s, seq))
    finally:
        cluster.shutdown()
    print(f"model {path}; batch 1, {a.sequential} requests of {a.max_tokens} tokens in blocks of {a.block}, "
          f"{a.rounds} rounds, backends alternating; a one-node Ray cluster started here in {cluster_s:.1f} s\n")
    report = Report(a.json)
    table = report.table(["backend", ("server start-up (s)", ".1f"), ("offline latency (ms)", ".1f"),
                          ("served latency (ms)", ".1f"), ("served path adds per step (ms)", ".3f"),
                          ("per block (ms)", ".2f")])
    for name, rs in rows.items():
        table.row(name, statistics.median(r[0] for r in rs),
                  *(statistics.median(r[1][k] for r in rs) for k in ("offline_ms", "http_ms", "extra_ms_per_step",
                                                                     "extra_ms_per_block")))
    report.save()


if __name__ == "__main__":
    main()
