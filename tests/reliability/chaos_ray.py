"""The chaos run's Ray part: the server on a Ray cluster simulated on this machine (ray.cluster_utils.Cluster: a head,
a second node and a spare, one CPU each, on loopback), two workers on STRICT_SPREAD, the SLO policy and the prefix
cache, under the same steady load as tests/reliability/chaos.py. A fault removes the node under a worker (not the
head's) with every process on it, at once; Ray moves the worker's bundle to the spare, the worker restarts there and
its requests resume; a fresh spare node then joins for the next loss.

    python -m tests.reliability.chaos          (runs this after the process faults; --ray-duration 0 skips it)
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

from .chaos import Fault, Front, Run, busiest, healthy, instances, under_load
from .tools import metrics, wait_for

RAY_KINDS = ("lose_ray_node",)
NAMESPACE = "dllm-server-chaos"
NODE = {"num_cpus": 1, "object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
# Ray rewrites a localhost address to the host's interface IP, and a driver then waits for ever: with this its
# node-IP detection returns loopback (set before Ray is imported, here and in the server's environment)
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def actor_nodes() -> dict[int, str]:
    """pid -> node id of every live actor of the server's namespace."""
    from ray.util.state import list_actors
    return {a.pid: a.node_id for a in list_actors(filters=[("state", "=", "ALIVE")], detail=True)
            if a.ray_namespace == NAMESPACE}


def lose_node(cluster, front: Front, fault: Fault) -> None:
    url = front.url
    nodes, head = actor_nodes(), cluster.head_node.node_id
    # the busiest worker off the head node (STRICT_SPREAD over two of three nodes: at least one is off it)
    off_head = [i for i in instances(url) if nodes.get(i["rank_pids"][0]) not in (None, head)]
    top = busiest(url)
    victim = top if top in off_head else off_head[0]
    node = next(n for n in cluster.list_all_nodes() if n.node_id == nodes[victim["rank_pids"][0]])
    before = metrics(url)
    fault.at = time.monotonic()
    cluster.remove_node(node, allow_graceful=False)
    if wait_for(lambda: metrics(url).get("dllm:worker_up", 2) < 2, 60, 0.05):
        fault.detect_s = time.monotonic() - fault.at
    cluster.add_node(**NODE, resources={f"spare_{fault.at:.0f}": 1})         # the next loss's spare
    cluster.wait_for_nodes()
    if wait_for(lambda: healthy(url, 2), 120, 0.5):
        fault.recover_s = time.monotonic() - fault.at
    after = metrics(url)
    fault.affected = int(after.get("dllm:requests_resumed_total", 0) - before.get("dllm:requests_resumed_total", 0))
    if after.get("dllm:worker_restarts_total", 0) <= before.get("dllm:worker_restarts_total", 0):
        fault.failed_checks.append("no worker restart counted")
    now = actor_nodes()
    if any(now.get(i["rank_pids"][0]) in (None, node.node_id) for i in instances(url)):
        fault.failed_checks.append(f"a worker not on a live node: {instances(url)} against {now}")


def chaos_ray(model: str, duration_s: float, seed: int, log_dir: Path, per_kind: int = 2,
              reference: dict[tuple[int, ...], str] | None = None) -> Run:
    os.environ.update(ENV)
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, connect=True, head_node_args={**NODE, "resources": {"node_a": 1}})
    try:
        cluster.add_node(**NODE, resources={"node_b": 1})
        cluster.add_node(**NODE, resources={"node_c": 1})
        cluster.wait_for_nodes()
        front = Front(model, log_dir, ("--distributed-executor-backend", "ray", "--ray-address", cluster.address,
                                       "--ray-namespace", NAMESPACE, "--ray-placement-strategy", "STRICT_SPREAD"),
                      name="chaos-ray-server", env=ENV)
        schedule = [k for k in RAY_KINDS for _ in range(per_kind)]
        random.Random(seed).shuffle(schedule)

        def inject(kind: str, run: Run) -> Fault:
            fault = Fault(kind, time.monotonic())
            lose_node(cluster, front, fault)
            return fault
        run = under_load(front, seed, schedule, duration_s, reference, inject)
        if wait_for(lambda: not actor_nodes(), 30, 0.5) is False:
            run.faults[-1].failed_checks.append(f"Ray actors left after the server stopped: {actor_nodes()}")
        return run
    finally:
        ray.shutdown()
        cluster.shutdown()
