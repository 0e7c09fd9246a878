"""Live regrouping (cluster/regroup.py): 2 x TP1 -> 1 x TP2 -> 2 x TP1 on this CPU's 2 "devices"
while requests keep arriving over HTTP, in float64: no request fails or is lost, every answer is
token-identical to the offline API, /health answers 200 throughout (polled through the app), KV
pages and running counts return to 0, and the time each drain took is printed. Refusals where a
regroup cannot work. The planner loop's decision (cluster/planner.py) on live step-time models; the planner
regrouping by itself; a worker killed while it drains and a shutdown (SIGTERM's path) in the middle of a
regroup."""
import asyncio
import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dllm_server import LLM, SamplingParams
from dllm_server.config import ServerConfig
from dllm_server.cluster.layout import Layout, changes

from tests.live import running


def stream(n: int, seed: int = 5):
    rng = random.Random(seed)
    return [({"prompt_token_ids": [rng.randrange(1, 250) for _ in range(rng.randrange(4, 40))]},
             SamplingParams(max_tokens=rng.choice([16, 40, 72]), temperature=rng.choice([0.0, 0.7]), seed=i,
                            ignore_eos=True, threshold=0.99)) for i in range(n)]


def _planner_inputs(instances: dict[int, int], **fields):
    """A real SLOPolicy with 32 SLO classes (1-s SLOs, 4 blocks, a 100-token canvas) and step-time models fitted to
    2 ms + 1 ms a row (+ 2 ms with a recompute) on the workers of `instances`; `fields` override the config's."""
    import numpy as np
    from dllm_server.costmodel.step_time import features
    from dllm_server.costmodel.worker_speed import WorkerLoadModel
    from dllm_server.policy.predictor import SimpleEstimator
    from dllm_server.policy.slo import SLOPolicy
    config = ServerConfig(model="unused", threshold_policy="slo", reconfigure=True, block_length=8,
                          reconfigure_period_s=10.0, reconfigure_restart_s=2.0, token_budget=None, **fields)
    load = WorkerLoadModel(8)
    for w in instances:
        for n in (1, 2, 4, 8, 16):
            load.models[w].add(features(8 * n, 100 * n), 0.002 + 0.001 * n)
            load.models[w].add(features(8 * n, 100 * n, 100, 100 ** 2), 0.004 + 0.001 * n)
    policy = SLOPolicy(config, SimpleEstimator(), load)
    policy.new_work = np.array([40.0, 36.0, 30.0, 26.0, 22.0, 20.0])
    policy.classes.extend([(1.0, policy.new_work, 4.0, 100)] * 32)
    return config, policy, load


def _steady(rate: float, now: float, span: float = 20.0) -> list[float]:
    return [now - span + k / rate for k in range(int(span * rate))]


async def test_regroup_2xtp1_to_1xtp2_and_back_under_load_loses_nothing(tiny_llada):
    """Through the HTTP app (the server's own routes, in this process over ASGI): the load is 60
    completions, one every 40 ms, and /health is polled every 10 ms, while the engine regroups;
    after each regroup /metrics shows the instances per TP degree, the regroups and the drains."""
    import httpx

    from dllm_server.api.app import build_app
    reqs = stream(60)
    offline = LLM(tiny_llada, block_length=8, dtype="float64").generate([p for p, _ in reqs], [s for _, s in reqs])
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float64", threads_per_worker=1, num_workers=2)
    async with running(config) as engine:
        transport = httpx.ASGITransport(app=build_app(engine, "tiny"))
        client = httpx.AsyncClient(transport=transport, base_url="http://server", timeout=120)
        health, stop = [], asyncio.Event()

        async def watch():
            while not stop.is_set():
                health.append((await client.get("/health")).status_code)
                await asyncio.sleep(0.01)

        async def one(p, s):
            body = {"prompt": p["prompt_token_ids"], "max_tokens": s.max_tokens, "temperature": s.temperature,
                    "seed": s.seed, "ignore_eos": True, "threshold": s.threshold, "return_token_ids": True}
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]

        async def load():                     # a steady stream: a request every 40 ms
            tasks = []
            for p, s in reqs:
                tasks.append(asyncio.ensure_future(one(p, s)))
                await asyncio.sleep(0.04)
            return await asyncio.gather(*tasks)

        async def scrape() -> dict:           # what a Prometheus scrape of the server sees
            text = (await client.get("/metrics")).text
            return {(s.name, s.labels.get("tp_size")): s.value
                    for fam in text_string_to_metric_families(text) for s in fam.samples}
        watcher, sender = asyncio.ensure_future(watch()), asyncio.ensure_future(load())
        await asyncio.sleep(0.6)
        to_tp2 = await engine.reconfigure([2])
        assert [w.tp_size for w in engine.stats().workers if w.up] == [2]
        seen = await scrape()
        assert seen[("dllm:instances", "2")] == 1 and ("dllm:instances", "1") not in seen
        assert seen[("dllm:reconfigurations_total", None)] == 1
        await asyncio.sleep(0.6)
        back = await engine.reconfigure([1, 1])
        seen = await scrape()
        assert seen[("dllm:instances", "1")] == 2 and ("dllm:instances", "2") not in seen
        assert seen[("dllm:reconfigurations_total", None)] == 2
        assert seen[("dllm:drain_seconds_total", None)] == pytest.approx(
            sum(to_tp2["drain_s"].values()) + sum(back["drain_s"].values()), abs=2e-3)   # those are rounded to ms
        outs = await sender
        await asyncio.sleep(0.3)              # idle: /health now runs its probe request through a worker
        stop.set()
        await watcher
        await client.aclose()
        stats = engine.stats()
        print(f"2 x TP1 -> 1 x TP2: drains {to_tp2['drain_s']} s, regroup {to_tp2['regroup_s']} s; "
              f"1 x TP2 -> 2 x TP1: drains {back['drain_s']} s, regroup {back['regroup_s']} s; "
              f"{len(health)} /health polls, all {set(health)}")
        assert to_tp2["stopped"] == [0, 1] and back["started"] == [0, 1]
        assert max(to_tp2["drain_s"].values()) > 0 and max(back["drain_s"].values()) > 0   # blocks were in flight
        assert set(health) == {200} and len(health) > 50
        assert stats.kv_pages_used == 0 and stats.num_running == 0 and stats.num_waiting == 0
        assert [w.tp_size for w in stats.workers] == [1, 1] and all(w.up for w in stats.workers)
        assert stats.counters.reconfigurations == 2
    assert all(o["finish_reason"] == "length" for o in outs)
    assert [o["token_ids"] for o in outs] == [o.token_ids for o in offline]


def test_regroup_refusals_and_layout_changes(tiny_llada):
    with pytest.raises(ValueError, match="reconfigure: needs colocated placement"):
        ServerConfig(reconfigure=True, threshold_policy="slo", placement="disaggregated")
    with pytest.raises(ValueError, match="reconfigure: needs"):
        ServerConfig(reconfigure=True)                                 # the planner plans thresholds
    assert changes(Layout.of_degrees([1, 1]), Layout.of_degrees([2])) == ({0, 1}, {0: (0, 1)})
    assert changes(Layout.of_degrees([2]), Layout.of_degrees([1, 1])) == ({0}, {0: (0,), 1: (1,)})
    assert changes(Layout.of_degrees([2, 1, 1]), Layout.of_degrees([2, 2])) == ({1, 2}, {1: (2, 3)})  # keeps TP2
    assert changes(Layout.of_degrees([1, 1]), Layout.of_degrees([1, 1])) == (set(), {})


async def test_reconfigure_refuses_a_bad_layout_while_serving(tiny_llada):
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float32", threads_per_worker=1, num_workers=2)
    async with running(config) as engine:
        with pytest.raises(ValueError, match="must add up to the 2 devices"):
            await engine.reconfigure([1])
        with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide"):
            await engine.reconfigure([3, -1])
        out = await engine.run({"prompt_token_ids": [3, 4]}, SamplingParams(max_tokens=8))
        assert out.finish_reason in ("stop", "length")


def test_the_planner_keeps_a_steady_load_and_regroups_when_it_pays(tiny_llada):
    """decide() on live-like inputs: a real SLOPolicy's fields and a WorkerLoadModel fitted to a
    linear step time; a steady light load never regroups (the current layout is the target, or
    the gain is below the minimum), and with a tight SLO only TP2 meets, it asks for TP2."""
    from dllm_server.cluster.planner import PlannerState, decide
    from dllm_server.costmodel.worker_speed import WorkerLoadModel
    from dllm_server.policy.predictor import SimpleEstimator
    from dllm_server.policy.slo import SLOPolicy
    from dllm_server.costmodel.step_time import features
    config = ServerConfig(model=tiny_llada, threshold_policy="slo", reconfigure=True, block_length=8,
                          reconfigure_period_s=10.0, reconfigure_planner="ilp")
    load = WorkerLoadModel(8)
    for w in (0, 1):
        for n in (1, 2, 4, 8, 16):
            load.models[w].add(features(8 * n, 100 * n), 0.002 + 0.001 * n)
            load.models[w].add(features(8 * n, 100 * n, 100, 100 ** 2), 0.004 + 0.001 * n)
    policy = SLOPolicy(config, SimpleEstimator(), load)
    policy.new_work = [40.0, 36.0, 30.0, 26.0, 22.0, 20.0]           # forwards per request at each candidate
    policy.classes.extend([(10.0, policy.new_work, 5.0, 100)] * 8)   # SLO classes: budget, forwards, blocks, canvas
    state, now = PlannerState(), 100.0
    steady = [now - 10 + 0.5 * k for k in range(20)]                # 2 req/s for the last period
    assert decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, steady, now, state) is None
    assert decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, steady, now + 10, state) is None
    policy.classes.clear()
    policy.classes.extend([(0.06, policy.new_work, 5.0, 100)] * 8)                                # 20+ forwards at ~3 ms: only a faster
    degrees = decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, [now + 19.5], now + 20, state)   # instance fits
    assert degrees == [2], state.last


def test_the_attainment_planner_keeps_its_best_layout_and_regroups_under_overload():
    """decide() with the attainment planner on a real SLOPolicy's SLO classes and a WorkerLoadModel fitted to a
    linear step time on one TP2 instance (TP1 priced by the prior): a light steady load keeps the one fast
    instance; a load it cannot serve regroups into two TP1 instances, once, and not again within a period."""
    from dllm_server.cluster.planner import PlannerState, decide
    config, policy, load = _planner_inputs({0: 2})
    assert config.reconfigure_planner == "attainment"
    state, now = PlannerState(), 100.0

    def rate(r, t):
        return _steady(r, t, 10.0)
    assert decide(config, policy, load, {0: 2}, (4, 4), 2, rate(2, now), now, state) is None, state.last
    assert "the best layout is the current one" in state.last["why"]
    assert decide(config, policy, load, {0: 2}, (4, 4), 2, rate(2, now + 10), now + 10, state) is None
    # two TP1 instances would answer sooner at 30 req/s, both meeting every SLO: not worth the one instance's restart
    assert decide(config, policy, load, {0: 2}, (4, 4), 2, rate(30, now + 20), now + 20, state) is None
    assert state.last["target"] == [1, 1] and state.last["target_tail_s"] < state.last["current_tail_s"]
    assert state.last["price"] > 0.005 and "restart price" in state.last["why"]
    heavy = rate(40, now + 30)                                     # beyond one TP2 instance, within two TP1
    assert decide(config, policy, load, {0: 2}, (4, 4), 2, heavy, now + 30, state) == [1, 1], state.last
    last = state.last
    assert last["target_attainment"] > last["current_attainment"] + config.reconfigure_min_gain + last["price"]
    assert decide(config, policy, load, {0: 2}, (4, 4), 2, heavy, now + 35, state) is None   # within a period
    assert "< one period" in state.last["why"]


@pytest.mark.parametrize("rate, moves", [(2, True), (6, False)])
def test_a_move_for_the_tail_alone_must_be_cheap_at_the_load_room_to_grow_plans_for(rate, moves):
    """2 x TP1 -> 1 x TP2 answers sooner at the same attainment (0.2-s SLOs); its restart takes one TP1 out at a
    time. At 6 req/s the forecast prices that at nothing, but at 3 x the load one TP1 alone would miss: keep.
    (A planner that remembers one period: no load the cluster was sized for, the test below.)"""
    from dllm_server.cluster.planner import PlannerState, decide
    config, policy, load = _planner_inputs({0: 1, 1: 1}, reconfigure_memory_periods=1)
    policy.classes.clear()
    policy.classes.extend([(0.2, policy.new_work, 4.0, 100)] * 32)
    state = PlannerState()
    out = decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, _steady(rate, 100.0, 10.0), 100.0, state)
    assert state.last["target"] == [2] and state.last["price"] < 0.005 and "same attainment" in state.last["why"]
    assert out == ([2] if moves else None), state.last
    assert moves or "the restart would cost" in state.last["why"]


def test_a_light_spell_after_a_heavy_one_keeps_the_room_the_heavy_one_needed():
    """2 x TP1 at 2 req/s with 0.2-s SLOs: alone, the planner moves to 1 x TP2 for the tail (the test above). After
    a period at 40 req/s, which one TP2 cannot carry, the same light period keeps 2 x TP1: the planner remembers
    the busiest of its last periods and a move must leave room for it."""
    from dllm_server.cluster.planner import PlannerState, decide
    config, policy, load = _planner_inputs({0: 1, 1: 1})
    policy.classes.clear()
    policy.classes.extend([(0.2, policy.new_work, 4.0, 100)] * 32)
    state = PlannerState()
    assert decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, _steady(40, 80.0, 10.0), 80.0, state) is None
    assert decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, _steady(2, 100.0, 10.0), 100.0, state) is None
    assert state.last["target"] == [1, 1], state.last
    for k in range(config.reconfigure_memory_periods - 1):     # the heavy period forgotten: the tail's move is back
        out = decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, _steady(2, 110.0 + 10 * k, 10.0), 110.0 + 10 * k,
                     state)
        assert out is None or k == config.reconfigure_memory_periods - 2, (k, state.last)   # the prior gone first
    assert out == [2] and "same attainment" in state.last["why"], state.last


def test_the_layout_the_cluster_starts_in_is_the_load_it_was_sized_for_until_the_memory_fills():
    """2 x TP1 at 2 req/s with 0.2-s SLOs, where one TP2 answers sooner (the tests above): the first light periods
    say nothing about the next, so the starting layout's capacity at the load target counts as a remembered period
    and the planner keeps 2 x TP1; once the memory holds that many real periods, all light, it moves."""
    from dllm_server.cluster.planner import PlannerState, decide
    config, policy, load = _planner_inputs({0: 1, 1: 1})
    policy.classes.clear()
    policy.classes.extend([(0.2, policy.new_work, 4.0, 100)] * 32)
    state, memory = PlannerState(), config.reconfigure_memory_periods
    for k in range(memory - 1):
        now = 100.0 + 10 * k
        assert decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, _steady(2, now, 10.0), now, state) is None
        assert state.last["target"] == [1, 1], state.last
    assert state.sized_for == {1: 2}
    now = 100.0 + 10 * memory
    assert decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, _steady(2, now, 10.0), now, state) == [2]
    assert "same attainment" in state.last["why"]
    # a cluster started as 1 x TP2 was sized for less: under 40 req/s it grows into 2 x TP1 at once
    config, policy, load = _planner_inputs({0: 2})
    assert decide(config, policy, load, {0: 2}, (4, 4), 2, _steady(40, 100.0, 10.0), 100.0, PlannerState()) == [1, 1]


@pytest.mark.parametrize("load_target", [0.7, 0.9])
def test_a_move_with_room_for_the_remembered_peak_is_refused_where_it_would_meet_less_there(load_target):
    """2 x TP1 with 0.1-s SLOs was sized for 43.6 req/s (the test below); at 2 req/s one TP2 ties it and answers
    sooner. At a load target of 0.7 one TP2 has no room for that load. At 0.9 it has room (0.9 x its capacity is
    above 43.6 req/s), yet at that load it would meet none of the SLOs that 2 x TP1 meets: the planner ranks what a
    layout meets at the remembered peak ahead of its tail, and keeps 2 x TP1 either way."""
    from dllm_server.cluster.attainment import Prediction
    from dllm_server.cluster.planner import PlannerState, choose, decide
    config, policy, load = _planner_inputs({0: 1, 1: 1}, load_target=load_target)
    policy.classes.clear()
    policy.classes.extend([(0.1, policy.new_work, 4.0, 100)] * 32)
    state = PlannerState()
    assert decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, _steady(2, 100.0, 10.0), 100.0, state) is None
    last = state.last
    assert last["target"] == [1, 1] and "the best layout is the current one" in last["why"], last
    # the ranking by hand: equal now, the shorter tail loses to the layout that meets more at the peak
    fast, slow = Prediction(1.0, 0.9, 0.1, 50.0), Prediction(1.0, 0.9, 0.2, 50.0)
    peak = {2: 0.0, 1: 1.0}
    assert choose([(fast, {2: 1}), (slow, {1: 2})], lambda p: True, 0.02, lambda lay: peak[max(lay)]) == (slow, {1: 2})
    assert choose([(fast, {2: 1}), (slow, {1: 2})], lambda p: True, 0.02, lambda lay: 1.0) == (fast, {2: 1})


@pytest.mark.parametrize("slo_s, capped", [(0.1, False), (30.0, True)])
def test_the_sized_for_load_is_where_the_start_stops_meeting_its_slos_or_its_capacity(slo_s, capped):
    """The load a start was sized for: the highest steady rate at which it meets at most the min gain less than it
    does unloaded (tight SLOs: below its capacity), never above its capacity at the load target (loose SLOs)."""
    import dataclasses
    import numpy as np
    from dllm_server.cluster.attainment import InstanceModel, predict
    from dllm_server.cluster.capacity_table import from_step_time_model
    from dllm_server.cluster.planner import _sized_for_rate, degree_models, sample_demand
    config, policy, load = _planner_inputs({0: 1, 1: 1})
    policy.classes.clear()
    policy.classes.extend([(slo_s, policy.new_work, 4.0, 100)] * 32)
    demand = sample_demand(policy, _steady(2, 100.0, 10.0), 100.0, 10.0)
    models = degree_models(load, {0: 1, 1: 1}, [1, 2], serial_share=0.4)
    inst = {d: InstanceModel(from_step_time_model(models, 8), d, config.max_active_decodes, demand, 5,
                             token_budget=None, credit_share=config.credit_share, row_tokens=8) for d in (1, 2)}
    start = {1: 2}

    def met(rate):
        return predict(start, inst, dataclasses.replace(demand, window_rates=np.full(2, rate)),
                       config.load_target).attainment
    rate = _sized_for_rate(config, start, inst, demand)
    cap = config.load_target * predict(start, inst, demand, config.load_target).capacity
    floor = met(1e-3) - config.reconfigure_min_gain
    assert 0 < rate <= cap and met(rate) >= floor
    assert (rate == cap) == capped
    assert capped or met(rate + 0.002 * cap) < floor


async def test_the_planner_regroups_by_itself_and_answers_identically(tiny_llada):
    """--reconfigure on 2 CPU workers with no call from the test: light requests with a loose SLO tie on
    attainment, the prior prices one TP2 instance's tail below two TP1s', so a planner that remembers one period (no
    load the cluster was sized for) regroups at its first decision; every answer arrives and equals the offline
    API's (float64; the ladder is one threshold, 0.99)."""
    from dllm_server.cluster.regroup import RegroupRecord
    reqs = [(p, SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed, ignore_eos=True,
                               slo_ms=60_000.0)) for p, s in stream(40, seed=7)]
    offline = LLM(tiny_llada, block_length=8, dtype="float64").generate(
        [p for p, _ in reqs], [SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed,
                                              ignore_eos=True, threshold=0.99) for _, s in reqs])
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float64", threads_per_worker=1, num_workers=2,
                          threshold_policy="slo", slo_thresholds="0.99", quality_floor=0.99, reconfigure=True,
                          reconfigure_period_s=1.0, reconfigure_restart_s=1.0, reconfigure_memory_periods=1)
    async with running(config) as engine:
        records: list[RegroupRecord] = engine.regroups.driver.records
        tasks = []
        for p, s in reqs:                       # 40 requests over 4 s: the planner decides every second
            tasks.append(asyncio.ensure_future(engine.run(p, s)))
            await asyncio.sleep(0.1)
        outs = await asyncio.gather(*tasks)
        for _ in range(200):                    # a regroup begun at the last decision finishes
            if engine.regroups.driver.active is None:
                break
            await asyncio.sleep(0.05)
        decisions = engine.regroups.driver.decisions
        print("planner:", [(round(t, 1), d.get("regroup"), d.get("target"), d.get("why")) for t, d in decisions])
        assert records and all(r.why != "asked" for r in records), decisions
        assert records[0].target == [2] and "same attainment" in records[0].why
        assert all(o.finish_reason == "length" for o in outs)
        assert [o.token_ids for o in outs] == [o.token_ids for o in offline]


async def test_a_worker_killed_while_it_drains_loses_nothing(tiny_llada):
    """2 x TP1 -> 1 x TP2 under load, worker 1 SIGKILLed as soon as it is asked to drain: its requests resume
    elsewhere from their canvases, the regroup finishes (or fails with a clear error), every request is answered
    token-identically to offline (float64), and the server serves afterwards."""
    import os
    import signal
    reqs = stream(30, seed=11)
    offline = LLM(tiny_llada, block_length=8, dtype="float64").generate([p for p, _ in reqs], [s for _, s in reqs])
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float64", threads_per_worker=1, num_workers=2)
    async with running(config) as engine:
        tasks = []
        for p, s in reqs[:20]:
            tasks.append(asyncio.ensure_future(engine.run(p, s)))
            await asyncio.sleep(0.02)
        victim = engine.pool.pids(1)[0]
        for _ in range(500):     # worker 1 busy, or the drain ends at once and the kill hits a worker it stops anyway
            w1 = next(w for w in engine.stats().workers if w.worker_id == 1)
            if w1.num_active_decodes or w1.outstanding_prefill_tokens:
                break
            await asyncio.sleep(0.01)
        regroup = asyncio.ensure_future(engine.reconfigure([2]))
        await asyncio.sleep(0)                       # the drain has begun: worker 1 is held by the regroup
        os.kill(victim, signal.SIGKILL)
        for p, s in reqs[20:]:
            tasks.append(asyncio.ensure_future(engine.run(p, s)))
            await asyncio.sleep(0.02)
        try:
            result = await regroup
            print("regroup:", result)
        except (RuntimeError, TimeoutError) as e:     # a clear error is allowed; a hang or a lost request is not
            print("regroup failed:", e)
        outs = await asyncio.gather(*tasks)
        after = await engine.run(*reqs[0])
        stats = engine.stats()
    assert stats.counters.worker_restarts == 1, stats.counters  # the kill was seen (and the slot then retired)
    assert [o.token_ids for o in outs] == [o.token_ids for o in offline]
    assert after.token_ids == offline[0].token_ids
    assert stats.num_running == 0 and stats.kv_pages_used == 0


async def test_shutdown_in_the_middle_of_a_regroup_answers_everything(tiny_llada):
    """What SIGTERM runs (engine.shutdown with a drain timeout) while 2 x TP1 -> 1 x TP2 drains under load: every
    request in flight ends with its answer or a clear error, the regroup ends (done or with an error), and the
    shutdown returns; nothing hangs."""
    import time

    from dllm_server.engine.async_engine import AsyncEngine
    reqs = stream(20, seed=13)
    offline = LLM(tiny_llada, block_length=8, dtype="float64").generate([p for p, _ in reqs], [s for _, s in reqs])
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float64", threads_per_worker=1, num_workers=2)
    engine = AsyncEngine(config)
    await engine.start(timeout_s=120)
    tasks = []
    for p, s in reqs:
        tasks.append(asyncio.ensure_future(engine.run(p, s)))
        await asyncio.sleep(0.02)
    regroup = asyncio.ensure_future(engine.reconfigure([2]))
    await asyncio.sleep(0)
    t0 = time.monotonic()
    await asyncio.wait_for(engine.shutdown(30.0), 90.0)
    took = time.monotonic() - t0
    outs = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10.0)
    ended = await asyncio.wait_for(asyncio.gather(regroup, return_exceptions=True), 10.0)
    print(f"shutdown took {took:.2f} s; regroup: {ended[0]!r}; "
          f"answers {sum(not isinstance(o, BaseException) for o in outs)} of {len(outs)}")
    for o, off in zip(outs, offline):
        if isinstance(o, BaseException):
            assert str(o), o                          # an error names what happened
        else:
            assert o.token_ids == off.token_ids


def test_a_move_for_the_tail_alone_keeps_room_for_the_load_to_grow():
    from dllm_server.cluster.planner import HEADROOM, PlannerState, decide
    config, policy, load = _planner_inputs({0: 1, 1: 1}, reconfigure_memory_periods=1)
    state = PlannerState()               # 8 req/s: one TP2 (priced by the prior) answers sooner and has room
    assert decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, _steady(8, 100.0), 100.0, state) == [2]
    assert "same attainment" in state.last["why"]
    state = PlannerState()               # 30 req/s: still every SLO met and a shorter tail, but no room to grow
    assert decide(config, policy, load, {0: 1, 1: 1}, (4, 4), 2, _steady(30, 100.0), 100.0, state) is None
    assert f"no room for {HEADROOM:g} x" in state.last["why"] and state.last["target"] == [2]


def test_the_attainment_planner_trusts_what_the_current_layout_met_and_calibrates_forwards():
    import numpy as np
    from dllm_server.cluster.planner import PlannerState, decide, sample_demand
    config, policy, load = _planner_inputs({0: 2})
    heavy = _steady(40, 100.0)           # one TP2 instance is predicted to miss; two TP1 would not
    state = PlannerState()
    assert decide(config, policy, load, {0: 2}, (4, 4), 2, heavy, 100.0, state) == [1, 1]
    # the same steady load, but the last period's 16 finished requests all met their SLOs: nothing to fix
    policy.outcomes.extend([(95.0, True)] * 16)
    state = PlannerState()
    assert decide(config, policy, load, {0: 2}, (4, 4), 2, heavy, 100.0, state) is None
    assert state.last["measured_attainment"] == 1.0 and state.last["target_attainment"] > \
        state.last["current_attainment"]
    # a rising load makes the past no guide: the same outcomes, but twice the arrivals of the period before
    rising = _steady(20, 90.0, 10.0) + _steady(40, 100.0, 10.0)
    state = PlannerState()
    assert decide(config, policy, load, {0: 2}, (4, 4), 2, rising, 100.0, state) == [1, 1]
    # forwards as predicted at admission, scaled by how finished requests compared (the median, within [0.5, 2])
    base = sample_demand(policy, heavy, 100.0, 10.0).forwards
    policy.forward_ratios.extend([0.6] * 16)
    assert sample_demand(policy, heavy, 100.0, 10.0).forwards == pytest.approx(np.maximum(0.6 * base, 4.0))
    policy.forward_ratios.extend([0.1] * 64)
    assert sample_demand(policy, heavy, 100.0, 10.0).forwards == pytest.approx(np.maximum(0.5 * base, 4.0))


async def test_the_reconfigure_endpoint_regroups_by_hand_and_refuses_clearly(tiny_llada):
    """--admin-endpoints: GET /reconfigure shows the layout and a regroup in progress, POST regroups (409 while one
    runs, 400 for a layout the devices or the heads refuse, never a 500); without the flag there is no such route."""
    import httpx

    from dllm_server.api.app import build_app
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float32", threads_per_worker=1, num_workers=2,
                          admin_endpoints=True)
    async with running(config) as engine:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(engine, "tiny")),
                                   base_url="http://server", timeout=120)
        assert (await client.get("/reconfigure")).json() == {"tensor_parallel_sizes": [1, 1], "regroup": None,
                                                             "regroups_done": 0}
        for body, param in (({"tensor_parallel_sizes": [1]}, "tensor_parallel_sizes"),
                            ({"tensor_parallel_sizes": [3, -1]}, "tensor_parallel_sizes"),
                            ({"tensor_parallel_sizes": []}, "tensor_parallel_sizes"),
                            ({"tensor_parallel_sizes": [2], "wait": 1}, "wait")):
            r = await client.post("/reconfigure", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        busy = [asyncio.ensure_future(client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 64,
                                                                           "steps": 64, "ignore_eos": True}))
                for _ in range(4)]
        await asyncio.sleep(0.3)
        first = asyncio.ensure_future(client.post("/reconfigure", json={"tensor_parallel_sizes": [2]}))
        for _ in range(100):
            status = (await client.get("/reconfigure")).json()
            if status["regroup"] is not None:
                break
            await asyncio.sleep(0.01)
        assert status["regroup"]["from"] == [1, 1] and status["regroup"]["to"] == [2], status
        second = await client.post("/reconfigure", json={"tensor_parallel_sizes": [1, 1]})
        assert second.status_code == 409 and "already running" in second.json()["error"]["message"]
        done = await first
        assert done.status_code == 200 and done.json()["layout"] == [2], done.text
        assert all(r.status_code == 200 for r in await asyncio.gather(*busy))
        assert (await client.get("/reconfigure")).json()["tensor_parallel_sizes"] == [2]
        same = await client.post("/reconfigure", json={"tensor_parallel_sizes": [2]})    # done inside begin()
        assert same.status_code == 200 and same.json()["layout"] == [2] and same.json()["stopped"] == []
        await client.aclose()
        for fields, path, status in (({"api_key": "k"}, "/reconfigure", 401),     # the app reads the config when
                                      ({"admin_endpoints": False}, "/reconfigure", 404)):   # it is built
            engine.config = config.replace(**fields)
            other = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(engine, "tiny")),
                                      base_url="http://s")
            assert (await other.post(path, json={"tensor_parallel_sizes": [2]})).status_code == status
            await other.aclose()


async def test_a_regroup_cut_short_by_a_shutdown_tells_its_caller(tiny_llada):
    """SIGTERM's path with no drain time while 2 x TP1 -> 1 x TP2 starts its new instance: the caller of
    reconfigure() gets RegroupAborted (POST /reconfigure: 503), not a hang, and the shutdown returns."""
    from dllm_server.engine.async_engine import AsyncEngine
    from dllm_server.engine.regroups import RegroupAborted
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float32", threads_per_worker=1, num_workers=2)
    engine = AsyncEngine(config)
    await engine.start(timeout_s=120)
    regroup = asyncio.ensure_future(engine.reconfigure([2]))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(engine.shutdown(0), 60)
    with pytest.raises(RegroupAborted, match="the server stopped during the regroup"):
        await asyncio.wait_for(regroup, 10)
