"""The server's reconfiguration planner on the simulator's virtual clock (sim/regroup.py): the same
cluster/planner.decide, cluster/regroup.Regroup and policy code, only the forward and transport
simulated. A rate change regroups, a steady rate settles at most once, nothing is lost, two runs decide
the same, and a merge in waves finishes."""
import numpy as np
import pytest

from dllm_server.config import ServerConfig
from dllm_server.sim.behaviour import POSITIONS_PER_FORWARD, SimRequest, positions_per_forward
from dllm_server.costmodel.gpu import MODELS, gpu_cost
from dllm_server.sim.instances import unloaded_latency_s, with_slos
from dllm_server.sim.regroup import layout_simulator, reconfigurer

LLADA = MODELS["llada-8b"]
COSTS: dict = {}
START = (2, 2)
FEW_FAST = (4,)


def cost_for(d: int):
    if d not in COSTS:
        COSTS[d] = gpu_cost("llada-8b", "h100", block_length=32, tp=d)
    return COSTS[d]


def trace(phases, seed=0):
    """Poisson arrivals over (duration_s, rate) phases, short ShareGPT-ish lengths, SLO 3 x the
    unloaded TP4 latency at 0.95."""
    rng, out, t0 = np.random.default_rng(seed), [], 0.0
    for dur, rate in phases:
        t = t0 + rng.exponential(1 / rate)
        while t < t0 + dur:
            out.append(SimRequest(float(t), int(rng.integers(600, 1400)), int(rng.integers(200, 500))))
            t += rng.exponential(1 / rate)
        t0 += dur
    ppf = positions_per_forward(POSITIONS_PER_FORWARD["llada-8b"], 0.95)
    return with_slos(out, [3 * unloaded_latency_s(cost_for(4), r.prompt_len, r.max_tokens, 32, ppf) for r in out])


def run(requests, start, **fields):
    config = ServerConfig(block_length=32, threshold=0.9, threshold_policy="slo", slo_thresholds="0.95,0.9,0.8,0.7",
                          quality_floor=0.7, load_control=True, routing="completion", token_budget=1024,
                          max_waiting_requests=1 << 20, reconfigure_period_s=10.0, reconfigure_restart_s=2.0, **fields)
    sim = layout_simulator(start, cost_for, config)
    rc = reconfigurer(sim, cost_for, 2.0, (LLADA.heads, LLADA.kv_heads), gpus_per_node=4)
    return sim.run(requests), rc


def decisions(rc):
    return [(t, d.get("regroup"), d.get("target"), round(d.get("rate", 0.0), 9)) for t, d in rc.decisions]


@pytest.fixture(scope="module")
def burst():
    """4 devices as one TP4 instance (sized for light load): a light phase, then one it cannot carry."""
    reqs = trace([(30.0, 0.3), (40.0, 8.0)])
    return reqs, run(reqs, FEW_FAST)


def test_a_rate_change_regroups_and_loses_nothing(burst):
    """Light: one TP4 instance answers soonest, and the planner keeps it; the heavy phase is followed within one
    period by 4 x TP1, which serves the most (more capacity than the starting layout's: the prior allows it)."""
    reqs, (res, rc) = burst
    assert [(r.source, r.target) for r in rc.records] == [([4], [1, 1, 1, 1])], decisions(rc)
    heavy, = rc.records
    assert 30.0 < heavy.began_s <= 40.0 and "attainment gain" in heavy.why
    assert heavy.waves == 1 and heavy.idle_gpu_s == pytest.approx(4 * 2.0, abs=0.1)   # one TP4 out: 4 restarts
    assert not any(d["regroup"] for t, d in rc.decisions if t <= 30.0)               # light and steady: it keeps
    assert rc.active is None and res.unfinished == 0
    assert len(res.requests) == len(reqs)
    assert all(r.finish_reason in ("stop", "length") for r in res.requests)
    assert res.counters.reconfigurations == len(rc.records)


def test_two_runs_decide_the_same(burst):
    reqs, (res, rc) = burst
    res2, rc2 = run(reqs, FEW_FAST)
    assert decisions(rc2) == decisions(rc)
    assert [r.latency_s for r in res2.requests] == [r.latency_s for r in res.requests]


@pytest.mark.parametrize("memory, moves", [(1, 1), (8, 0)])
def test_a_steady_rate_settles_once(memory, moves):
    """From 2 x TP2 at 0.3 req/s one TP4 answers sooner. A planner that remembers one period moves there once,
    within three periods of its first decision with a request to plan for (a move for the tail alone waits for a
    restart priced under half a point and a p90 a sixth shorter, which a few requests a period blur), then never
    again; with 8 (the default) the starting layout is the load the cluster was sized for over the whole minute,
    and it never moves."""
    res, rc = run(trace([(60.0, 0.3)], seed=1), START, reconfigure_memory_periods=memory)
    assert len(rc.decisions) >= 5 and len(rc.records) == moves, decisions(rc)
    first = next(t for t, d in rc.decisions if not d["why"].startswith("no request"))
    assert all(r.began_s <= first + 30.0 and r.target == [4] and "same attainment" in r.why for r in rc.records)
    assert res.unfinished == 0


def test_merging_in_waves_finishes():
    """4 x TP2 -> 2 x TP4 in two waves: slots 0 and 1 start (as TP4s) in the first wave and slots 2, 3 stop in
    it too; a slot that stops in one wave and starts in another once left the regroup waiting forever."""
    config = ServerConfig(block_length=32, threshold_policy="slo", slo_thresholds="0.95,0.9,0.8,0.7",
                          quality_floor=0.7, token_budget=1024, reconfigure_period_s=10.0)
    sim = layout_simulator([2, 2, 2, 2], cost_for, config)
    rc = reconfigurer(sim, cost_for, 2.0, (LLADA.heads, LLADA.kv_heads), gpus_per_node=8, schedule=[(5.0, [4, 4])])
    res = sim.run(trace([(20.0, 1.0)], seed=2))
    assert rc.active is None and [(r.source, r.target, r.waves) for r in rc.records] == [([2, 2, 2, 2], [4, 4], 2)]
    assert res.unfinished == 0
