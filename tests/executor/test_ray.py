"""The ray launch backend on a two-node Ray cluster simulated on this machine
(ray.cluster_utils.Cluster, one CPU a node, loopback pinned): colocated workers spread over both
nodes and a disaggregated pair with prefill on one node and decode on the other are
token-identical to the offline API; the requests of a worker process killed mid-load, or of one
stopped (a hang the watchdog finds), resume with the same answers and the server recovers; a
shutdown leaves no live actor or placement group of ours. One cluster for the module (Ray's own
advice: its start-up is the cost)."""
import asyncio
import os

import pytest

# Ray rewrites a localhost address to the host's interface IP and a driver then waits for ever;
# this makes its node-IP detection return loopback (every node stays on 127.0.0.1). It must be
# set before Ray is imported.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="Ray is not installed (the ray or test extra)")

from dllm_server import LLM  # noqa: E402
from dllm_server.config import ServerConfig  # noqa: E402
from dllm_server.engine.async_engine import AsyncEngine  # noqa: E402

from tests.live import kill_resumes, recovers, slow_requests, stop_is_found  # noqa: E402
from tests.engine.test_placements import mixed_requests  # noqa: E402

pytestmark = pytest.mark.timeout(600)
NAMESPACE = "dllm-server-test"


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster
    node = {"num_cpus": 1, "object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
    c = Cluster(initialize_head=True, head_node_args={**node, "resources": {"node_a": 1}})
    c.add_node(**node, resources={"node_b": 1})
    yield c
    ray.shutdown()            # no driver may stay connected while its nodes go
    c.shutdown()


def actor_nodes() -> dict[int, str]:
    """pid -> node id of every live actor of our namespace (while an engine holds Ray's
    connection in this process)."""
    from ray.util.state import list_actors
    return {a.pid: a.node_id for a in list_actors(filters=[("state", "=", "ALIVE")], detail=True)
            if a.ray_namespace == NAMESPACE}


def ray_config(cluster, model: str, **kw) -> ServerConfig:
    return ServerConfig(**{"model": model, "block_length": 8, "dtype": "float32", "threads_per_worker": 1,
                           "distributed_executor_backend": "ray", "ray_address": cluster.address,
                           "ray_namespace": NAMESPACE, "ray_placement_strategy": "STRICT_SPREAD", **kw})


async def _serve(config: ServerConfig, reqs, check=None):
    engine = AsyncEngine(config)
    await engine.start(timeout_s=180)
    try:
        outs = await asyncio.gather(*[engine.run(p, s) for p, s in reqs])
        pids = [w.rank_pids[0] for w in engine.stats().workers]
        extra = check(engine) if check else None
        return outs, pids, extra, engine.stats()
    finally:
        await engine.shutdown(0)


@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
def test_workers_on_two_nodes_match_offline(cluster, tiny_llada, placement):
    reqs = mixed_requests(12)
    offline = LLM(tiny_llada, block_length=8, dtype="float32").generate([p for p, _ in reqs], [s for _, s in reqs])
    config = ray_config(cluster, tiny_llada, placement=placement, num_workers=2 if placement == "colocated" else 1,
                        num_prefill_workers=1)
    outs, pids, nodes, stats = asyncio.run(_serve(config, reqs, check=lambda e: actor_nodes()))
    assert [o.token_ids for o in outs] == [o.token_ids for o in offline]
    assert len({nodes[p] for p in pids}) == 2                  # one worker on each node
    if placement == "disaggregated":
        assert stats.counters.kv_transfer_bytes > 0 and stats.counters.kv_transfers_failed == 0


def test_a_killed_workers_requests_resume_and_the_server_recovers(cluster, tiny_llada):
    async def run():
        engine = AsyncEngine(ray_config(cluster, tiny_llada, num_workers=2))
        await engine.start(timeout_s=180)
        try:
            tasks, ended = slow_requests(engine, 24, max_tokens=480)
            while engine.stats().num_running < 8:                  # both workers busy
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            assert not any(t.done() for t in tasks)
            victim = engine.stats().workers[0].pid
            await kill_resumes(engine, victim, tasks, 24, max_tokens=480)
            await recovers(engine, timeout_s=90, requests=6)
            assert engine.stats().workers[0].pid != victim
        finally:
            await engine.shutdown(0)
    asyncio.run(run())


def test_a_stopped_worker_is_found_by_the_watchdog_and_its_requests_resume(cluster, tiny_llada):
    """SIGSTOP of a worker actor's process (a hang: Ray still sees it alive): the watchdog finds it within its
    timeout + 5 s, Ray kills it, its requests resume on the other worker or the restarted one and answer as without
    the fault."""

    async def run():
        engine = AsyncEngine(ray_config(cluster, tiny_llada, num_workers=2, worker_stall_timeout_s=5.0,
                                        dtype="float64"))
        await engine.start(timeout_s=180)
        try:
            tasks, _ = slow_requests(engine, 12, max_tokens=200)
            while engine.stats().num_running < 4:
                await asyncio.sleep(0.05)
            victim = engine.stats().workers[0].pid
            detected_s = await stop_is_found(engine, victim, 5.0)
            print(f"ray: a stopped worker found after {detected_s:.2f} s (watchdog 5 s)")
            outs = await asyncio.wait_for(asyncio.gather(*tasks), 180)
            assert all(o.finish_reason == "length" for o in outs) and engine.stats().counters.requests_resumed >= 1
            await recovers(engine, timeout_s=90, requests=4)
            again, _ = slow_requests(engine, 12, max_tokens=200)
            assert [o.token_ids for o in await asyncio.gather(*again)] == [o.token_ids for o in outs]
            assert victim not in [w.pid for w in engine.stats().workers]
        finally:
            await engine.shutdown(0)
    asyncio.run(run())


def test_shutdown_leaves_no_actor_or_placement_group_of_ours(cluster, tiny_llada):
    from ray.util.state import list_actors, list_placement_groups
    asyncio.run(_serve(ray_config(cluster, tiny_llada, num_workers=2), mixed_requests(2)))
    ray.init(address=cluster.address, namespace=NAMESPACE, ignore_reinit_error=True)
    try:
        alive = [a for a in list_actors(filters=[("state", "=", "ALIVE")], detail=True) if a.ray_namespace == NAMESPACE]
        groups = [g for g in list_placement_groups(detail=True) if g.state != "REMOVED"]
    finally:
        ray.shutdown()
    assert alive == [] and groups == []


def test_losing_a_node_resumes_its_requests_on_a_spare_node(cluster, tiny_llada):
    """The loss of a whole Ray node (its raylet and every process on it), with a spare node in the cluster: the
    worker on it dies with it, Ray moves its placement-group bundle to the spare node, the worker restarts there,
    and its requests resume with the same answers. Last in the module: it changes the cluster."""
    import time
    cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20, node_ip_address="127.0.0.1", resources={"node_c": 1})
    cluster.wait_for_nodes()

    async def run():
        # float64: the resumed answers must equal a fault-free run's whatever the batches (float32 may round apart)
        engine = AsyncEngine(ray_config(cluster, tiny_llada, num_workers=2, dtype="float64"))
        await engine.start(timeout_s=180)
        try:
            tasks, _ = slow_requests(engine, 12, max_tokens=200)
            while engine.stats().num_running < 4:
                await asyncio.sleep(0.05)
            nodes = actor_nodes()
            head = cluster.head_node.node_id
            victim = next(w for w in engine.stats().workers if nodes[w.pid] != head)
            node = next(n for n in cluster.list_all_nodes() if n.node_id == nodes[victim.pid])
            lost_at = time.monotonic()
            cluster.remove_node(node, allow_graceful=False)
            outs = await asyncio.wait_for(asyncio.gather(*tasks), 240)
            resumed_s = time.monotonic() - lost_at
            assert all(o.finish_reason == "length" for o in outs) and engine.stats().counters.requests_resumed >= 1
            await recovers(engine, timeout_s=120, requests=4)
            recovered_s = time.monotonic() - lost_at
            again, _ = slow_requests(engine, 12, max_tokens=200)
            assert [o.token_ids for o in await asyncio.gather(*again)] == [o.token_ids for o in outs]
            now = actor_nodes()
            assert {now[w.pid] for w in engine.stats().workers} <= {n.node_id for n in cluster.list_all_nodes()} - \
                {node.node_id}
            print(f"ray: node lost; every request answered {resumed_s:.1f} s later, both workers serving after "
                  f"{recovered_s:.1f} s")
        finally:
            await engine.shutdown(0)
    asyncio.run(run())
