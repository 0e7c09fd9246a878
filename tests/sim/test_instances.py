"""Heterogeneous instances in the simulator: one cost model and pool per worker, a TP instance as
one worker costed at its degree, per-instance start-up profiles seeding the front's step-time
models, per-request SLOs, and `dllm-server plan --tensor-parallel`."""
import json

import pytest

from dllm_server.cli import main
from dllm_server.config import ServerConfig
from dllm_server.sim.behaviour import ParametricBehaviour, SimRequest
from dllm_server.sim.cluster import Simulator
from dllm_server.costmodel.gpu import MODELS, gpu_cost
from dllm_server.sim.instances import (layout_degrees, layout_instances, layout_name, startup_profile,
                                       unloaded_latency_s, with_slos)
from dllm_server.sizing import tp_candidates
from dllm_server.sim.workload import preset_workload

LLADA = MODELS["llada-8b"]


def two_instances(**cfg):
    """Worker 0 a TP1 instance, worker 1 a TP2 one."""
    costs = [gpu_cost("llada-8b", "h100", tp=1), gpu_cost("llada-8b", "h100", tp=2)]
    config = ServerConfig(num_workers=2, **cfg)
    return Simulator(config, None, ParametricBehaviour(seed=1), LLADA.model_info(), costs=costs, record=True), costs


def test_each_worker_runs_with_its_own_cost_and_pool():
    sim, costs = two_instances()
    assert sim.pages == [c.kv_pool_tokens() // 16 for c in costs] and sim.pages[1] > 2 * sim.pages[0]
    assert [w.core.pool.num_pages for w in sim.workers] == sim.pages
    assert [w.num_pages for w in sim.scheduler.workers] == sim.pages      # WorkerReady per instance
    assert [w.tp_size for w in sim.scheduler.workers] == [1, 2]
    # the same batch, one request each: the TP2 worker's turns are shorter
    res = sim.run([SimRequest(0.0, 600, 256), SimRequest(0.0, 600, 256)])
    assert res.unfinished == 0
    logs = res.iterations
    assert logs[0] and logs[1]
    same = {}
    for wid, log in logs.items():
        for (_, turn_s, prefills, ptok, dtok, decodes, _) in log:
            same.setdefault((prefills, ptok, dtok, decodes), {})[wid] = turn_s
    shared = [v for v in same.values() if len(v) == 2]
    assert shared and all(v[1] < v[0] for v in shared)
    for w in sim.workers:
        assert w.core.pool.num_free_pages == w.core.pool.num_pages


def test_the_single_cost_call_is_unchanged_and_costs_must_match_the_workers():
    cost = gpu_cost("llada-8b", "h100")
    config = ServerConfig(num_workers=2, num_pages=500)
    sim = Simulator(config, cost, ParametricBehaviour(), LLADA.model_info())
    assert sim.costs == [cost, cost] and sim.pages == [500, 500]            # the config's pages, as before
    with pytest.raises(ValueError, match="3 cost models for 2 workers"):
        Simulator(config, None, ParametricBehaviour(), LLADA.model_info(), costs=[cost] * 3)
    assert Simulator(config, None, ParametricBehaviour(), LLADA.model_info(), costs=[cost] * 2,
                     pages=[100, 200]).pages == [100, 200]


def test_profiles_seed_each_workers_step_time_model_where_the_engine_profiles():
    sim, costs = two_instances(threshold_policy="slo", default_slo_ms=5000.0)
    load = sim.scheduler.load
    assert all(load.models[w].ready for w in (0, 1))
    u0, u1 = load.unit_costs(0), load.unit_costs(1)
    assert u1.iteration_s < u0.iteration_s                         # the TP2 instance is seen as faster
    prof = startup_profile(costs[0], 32, "dual", 0, 4096, sim.pages[0], 16)
    assert len(prof) == 10 and prof[0][2] == 4 * 192 and prof[1][0] == 4 * 32
    res = sim.run(preset_workload("sharegpt", 20, 4.0, seed=2, max_len=4096))
    assert res.unfinished == 0 and all(r.thresholds for r in res.requests)
    plain, _ = two_instances()                                     # fixed policy, routing by load: no profile
    assert not any(m.ready for m in plain.scheduler.load.models.values())


def test_layouts_and_per_request_slos():
    degrees = layout_degrees({2: 2, 1: 3})
    assert degrees == (2, 2, 1, 1, 1) and layout_name(degrees) == "3 x TP1 + 2 x TP2"
    insts = layout_instances(degrees, lambda d: gpu_cost("llada-8b", "h100", tp=d), 16)
    assert insts[0].cost is insts[1].cost and insts[0].num_pages > insts[2].num_pages
    tp1, tp4 = gpu_cost("llada-8b", "h100"), gpu_cost("llada-8b", "h100", tp=4)
    assert unloaded_latency_s(tp4, 600, 256, 32, 2.0) < unloaded_latency_s(tp1, 600, 256, 32, 2.0)
    assert unloaded_latency_s(tp1, 600, 256, 32, 3.0) < unloaded_latency_s(tp1, 600, 256, 32, 2.0)
    # the estimate is a lone request's simulated latency, within a few per cent
    sim = Simulator(ServerConfig(threshold=0.9), None, ParametricBehaviour(), LLADA.model_info(), costs=[tp1])
    res = sim.run([SimRequest(0.0, 800, 266)])
    assert res.requests[0].latency_s == pytest.approx(unloaded_latency_s(tp1, 800, 266, 32, 3.01), rel=0.1)
    reqs = with_slos([SimRequest(0.0, 10, 32), SimRequest(1.0, 10, 32)], [0.5, 1e-6])
    config = ServerConfig(num_pages=1000)
    res = Simulator(config, tp1, ParametricBehaviour(), LLADA.model_info()).run(reqs)
    assert [r.slo_met for r in res.requests] == [True, False] and res.summary()["slo_attainment"] == 0.5


def test_tp_candidates_divide_the_heads_and_fit_the_gpus():
    cands, skipped = tp_candidates(8, [1, 2, 3, 4, 16], 32, 32, (1024,))
    assert [c.name for c in cands] == ["4 x TP2, tau=1024", "2 x TP4, tau=1024"]
    assert cands[0].changes["tensor_parallel_size"] == 2 and cands[0].changes["num_workers"] == 4
    assert any("TP3" in s for s in skipped) and any("TP16" in s for s in skipped)
    assert tp_candidates(6, [4], 32, 32)[0][0].name == "1 x TP4, tau=1024, 2 GPUs idle"


def test_cli_plan_ranks_tp_candidates_with_the_rest(capsys):
    assert main(["plan", "--workers", "4", "--requests", "12", "--taus", "1024", "--tolerance", "0.5",
                 "--slo-s", "3", "--start-rate", "4", "--tensor-parallel", "1,2,4", "--json", "--no-progress"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = [r["candidate"] for r in data["ranking"]]
    assert "2 x TP2, tau=1024" in names and "1 x TP4, tau=1024" in names and "colocated x4, tau=1024" in names
    assert len(names) == 9 and data["simulated"]          # 1 colocated + 3 splits x 2 + 2 TP
    caps = [r["capacity_req_s"] for r in data["ranking"]]
    assert caps == sorted(caps, reverse=True)
    pools = data["assumptions"]["tensor_parallel"]["kv_pool_tokens"]
    assert int(pools["4"]) > int(pools["2"]) > 0


def test_a_handoff_between_tp_instances_moves_each_ranks_heads_side_by_side():
    """SIMULATED: p x d ranks move a block's KV over min(p, d) links at once (each rank its heads), so TP 2 to
    TP 2 takes half the link time of TP 1 to TP 1, and TP 2 to TP 1 is bound by the one receiving link."""
    from dllm_server.sim.transport import Fabric
    cost = gpu_cost("llada-8b", "h100")
    nbytes = cost.kv_bytes(4096)

    def link_s(src_degree, dst_degree):
        fabric = Fabric(cost, lambda: 0.0, lambda *_: None, [src_degree, dst_degree])
        g = fabric.group((0, 1, 0))
        g.num_bytes, g.ready_at, g.posted_at = nbytes, 0.0, 0.0
        fabric.try_complete((0, 1, 0))
        return g.done_at

    one = link_s(1, 1)
    assert one == pytest.approx(cost.kv_transfer_s(nbytes))
    assert link_s(2, 2) == pytest.approx(cost.kv_transfer_s(nbytes / 2)) and link_s(2, 2) < 0.55 * one
    assert link_s(2, 1) == pytest.approx(one) and link_s(1, 4) == pytest.approx(one)
    assert link_s(4, 8) == pytest.approx(cost.kv_transfer_s(nbytes / 4))
