"""The cluster planner's pure parts (cluster/capacity_table.py, planner.py, transition.py): the
capacity table's formula by hand and its monotonicity, stage 1 against brute-force enumeration of
every integer layout, stage 2 against brute force on small clusters, overload, hysteresis and the
rate forecast."""
import functools
import itertools

import numpy as np
import pytest

pytest.importorskip("scipy.optimize")

from dllm_server.cluster.capacity_table import (capacity_table, from_roofline, from_step_time_model,  # noqa: E402
                                               instance_capacity, iteration_at, roofline_seats)
from dllm_server.cluster.layout_ilp import (SPARE_WEIGHT, UNSERVED_PENALTY, CapacityPlan, evaluate_layout,  # noqa: E402
                                        forecast_rate, plan_capacity, should_regroup)
from dllm_server.costmodel.step_time import StepTimeModel, features  # noqa: E402
from dllm_server.cluster.transition import Slot, candidate_slots, plan_transition, slot_of  # noqa: E402

DEGREES = (1, 2, 4, 8)
TAUS = (0.95, 0.9, 0.8, 0.7)


def linear_iteration(d, rows, keys, prefill_tokens, prefill_sq):
    """10 ms + 1 ms a decode row + 10 us a canvas token, all split d ways (a hand-checkable model)."""
    return (0.010 + 0.001 * rows + 1e-5 * prefill_tokens) / d


# ---- capacity table ----
def test_capacity_table_hand_case():
    # F = 10 forwards, R = 2 recompute steps, canvas 100: s = 0.2 n canvases an iteration, so
    # t_1(n) = 0.010 + 0.001 n + 1e-5 * 100 * 0.2 n = 0.010 + 0.0012 n and a request takes 10 t(n)
    assert iteration_at(linear_iteration, 1, 4, 0.8, 100) == pytest.approx(0.0148)   # the floor/ceil mix is exact
    loose = capacity_table((1, 2), (0.9,), linear_iteration, [10], 2, 100, slo_s=1.0, seats=4)
    assert loose[(1, 0.9)] == pytest.approx(4 / (10 * 0.0148))                  # n = 4 fits: 27.03 req/s
    assert loose[(2, 0.9)] == pytest.approx(4 / (10 * 0.0074))
    # SLO 0.12 s: 0.1 + 0.012 n <= 0.12 only for n = 1 at TP1; TP2 halves t, so n = 4 fits
    tight = capacity_table((1, 2), (0.9,), linear_iteration, [10], 2, 100, slo_s=0.12, seats=4)
    assert tight[(1, 0.9)] == pytest.approx(1 / 0.112) and tight[(2, 0.9)] == pytest.approx(4 / 0.074)
    assert capacity_table((1,), (0.9,), linear_iteration, [10], 2, 100, slo_s=0.05, seats=4)[(1, 0.9)] == 0.0
    assert instance_capacity(linear_iteration, 1, 10, 2, 100, 0.12, 4) == (pytest.approx(1 / 0.112), 1)
    with pytest.raises(ValueError):
        instance_capacity(linear_iteration, 1, 2, 3, 100, 1.0, 4)              # fewer forwards than recomputes


def test_the_token_budget_bounds_the_batch():
    # F = 10, R = 2, canvas 100: n seated need 0.2 n x 100 = 20 n recompute tokens an iteration;
    # tau = 200 with 10-token rows leaves max(200 - 10 n, 25): n = 6 needs 120 <= 140, n = 7 140 > 130
    free = instance_capacity(linear_iteration, 1, 10, 2, 100, 1.0, 32)
    rate, batch = instance_capacity(linear_iteration, 1, 10, 2, 100, 1.0, 32, token_budget=200, credit_share=0.125,
                                    row_tokens=10)
    assert free[1] > 6 and batch == 6 and rate == pytest.approx(6 / (10 * iteration_at(linear_iteration, 1, 6, 1.2, 100)))
    # batch 1 is always allowed (the idle rule admits the head prefill whatever the budget)
    assert instance_capacity(linear_iteration, 1, 10, 2, 100, 1.0, 32, token_budget=1, row_tokens=10)[1] == 1


@functools.lru_cache(maxsize=1)
def roofline():
    from dllm_server.costmodel.gpu import gpu_cost
    costs = {d: gpu_cost("llada-8b", "h100", tp=d) for d in DEGREES}
    return from_roofline(costs), roofline_seats(costs, 512)


@pytest.mark.parametrize("source", ["linear", "roofline"])
def test_capacity_monotone(source):
    it, seats = (linear_iteration, 32) if source == "linear" else roofline()
    slos = (4.0, 2.0, 1.0, 0.5) if source == "roofline" else (2.0, 1.0, 0.5, 0.2)

    def cap(d, forwards, recomputes, slo):
        return capacity_table((d,), (0.9,), it, [forwards], recomputes, 512, slo, seats)[(d, 0.9)]
    for d in DEGREES:
        by_recompute = [cap(d, 80, r, 2.0) for r in (1, 4, 8, 16, 40)]           # same forwards, more of them full
        by_cache = [cap(d, k + 8, 8, 2.0) for k in (10, 40, 80, 160)]            # same recomputes, more cache steps
        by_slo = [cap(d, 80, 8, s) for s in slos]
        for series in (by_recompute, by_cache, by_slo):
            assert all(a >= b - 1e-9 for a, b in zip(series, series[1:])), series
        assert by_slo[0] > 0
    table = capacity_table(DEGREES, TAUS, it, [120, 85, 65, 53], 8, 512, 2.0, seats)
    for d in DEGREES:                               # a lower threshold with fewer forwards never lowers it
        row = [table[(d, t)] for t in TAUS]
        assert all(a <= b + 1e-9 for a, b in zip(row, row[1:])), row


def test_adapters_price_what_the_cost_models_do():
    from dllm_server.costmodel.gpu import gpu_cost
    from dllm_server.costmodel.iteration import IterationStats
    cost = gpu_cost("llada-8b", "h100", tp=4)
    it = from_roofline({4: cost})
    want = cost.turn_s(IterationStats(prefill_tokens=2 * 512, decode_tokens=8 * 32, decode_keys=8 * 512,
                                      prefill_sq=2 * 512 ** 2, num_prefills=2, num_decodes=8))
    assert it(4, 8, 8 * 512, 2 * 512, 2 * 512 ** 2) == pytest.approx(want)
    m = StepTimeModel()
    for rows, pre in itertools.product((1, 4, 16), (0, 1, 2)):
        f = features(32 * rows, 300 * rows, 300 * pre, 300 ** 2 * pre)
        m.add(f, float(f @ np.array([2e-3, 1e-5, 1e-4, 2e-6, 1e-4][: len(f)])))
    live = from_step_time_model({2: m}, block_length=32)
    assert live(2, 4, 1200, 300, 300 ** 2) == pytest.approx(m.predict(features(128, 1200, 300, 300 ** 2)))
    assert from_step_time_model(m, 32)(8, 4, 1200, 0, 0) == pytest.approx(2e-3 + 128e-5 + 1.2e-4, rel=1e-3)


# ---- stage 1 ----
@functools.lru_cache(maxsize=1)
def all_layouts(max_devices=16) -> tuple[np.ndarray, np.ndarray]:
    """Every n[d, j] (d-major over DEGREES x TAUS) with sum d n <= max_devices: [pair, layout]
    floats, fewest devices first, and the devices each layout uses."""
    pairs = [(d, j) for d in DEGREES for j in range(len(TAUS))]
    out = []

    def rec(i, left, row):
        if i == len(pairs):
            out.append(row.copy())
            return
        for m in range(left // pairs[i][0] + 1):
            row[i] = m
            rec(i + 1, left - m * pairs[i][0], row)
    rec(0, max_devices, [0] * len(pairs))
    lay = np.array(out, dtype=np.float64)
    devices = lay @ np.repeat(DEGREES, len(TAUS))
    order = np.argsort(devices, kind="stable")
    return np.ascontiguousarray(lay[order].T), devices[order]


def brute_force(capacity, num_devices, rate, rho):
    """max over every integer layout of stage 1's objective, x filled greedily from the highest
    threshold (for a fixed layout the LP is a fractional knapsack: every req/s at tau_j is worth
    tau_j the same whatever the degree)."""
    lay, devices = all_layouts()
    lay = lay[:, : np.searchsorted(devices, num_devices, side="right")]
    cap = np.array([rho * capacity[(d, t)] for d in DEGREES for t in TAUS])
    per_gpu = max(rho * c / d for (d, _), c in capacity.items() if c > 0)
    norm = max(num_devices * per_gpu, 1e-12)
    level_cap = (cap[:, None] * lay).reshape(len(DEGREES), len(TAUS), -1).sum(axis=0)   # [J, L], highest tau first
    x = np.diff(np.minimum(np.cumsum(level_cap, axis=0), rate), prepend=0.0, axis=0)
    served = x.sum(axis=0)
    obj = (np.array(TAUS) @ x) / rate - UNSERVED_PENALTY * (rate - served) / rate \
        + SPARE_WEIGHT * (level_cap.sum(axis=0) - served) / norm
    best = int(np.argmax(obj))
    return float(obj[best]), float(rate - served[best]), float(served.max())


def random_capacity(rng):
    speed = np.cumprod([1.0] + list(rng.uniform(1.1, 2.4, 3)))          # per-instance rate grows with d
    level = np.cumprod([1.0] + list(rng.uniform(1.05, 1.6, 3)))          # and as the threshold falls
    c = rng.uniform(0.5, 5.0) * np.outer(speed, level)
    c[rng.random(c.shape) < 0.2] = 0.0                                   # some (d, tau) miss the SLO,
    for j in range(rng.integers(0, len(TAUS))):                         # like small degrees at high thresholds
        c[: rng.integers(0, len(DEGREES)), j] = 0.0
    return {(d, t): float(c[i, j]) for i, d in enumerate(DEGREES) for j, t in enumerate(TAUS)}


def test_stage1_equals_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        capacity = random_capacity(rng)
        if not any(capacity.values()):
            continue
        num_devices = int(rng.integers(1, 17))
        rho = float(rng.uniform(0.5, 0.9))
        most = max(rho * c / d for (d, _), c in capacity.items()) * num_devices
        rate = float(rng.uniform(0.05, 1.3) * max(most, 0.1))
        plan = plan_capacity(capacity, DEGREES, TAUS, num_devices, rate, rho)
        want, unserved, _ = brute_force(capacity, num_devices, rate, rho)
        assert plan.objective == pytest.approx(want, rel=1e-9, abs=1e-9)
        assert plan.unserved_rate == pytest.approx(unserved, abs=1e-6 * rate)
        assert plan.devices_used <= num_devices
        assert sum(plan.rates.values()) + plan.unserved_rate == pytest.approx(rate)
        assert plan.feasible == (plan.unserved_rate == 0.0) and bool(plan.why) == (not plan.feasible)


def test_overload_returns_the_max_served_plan():
    capacity = {(d, t): (2.0 + 0.5 * j) * d ** 0.6 for d in DEGREES for j, t in enumerate(TAUS)}
    plan = plan_capacity(capacity, DEGREES, TAUS, 16, 1000.0)
    _, unserved, most = brute_force(capacity, 16, 1000.0, 0.7)
    assert not plan.feasible and plan.served_rate == pytest.approx(most)
    assert plan.unserved_rate == pytest.approx(unserved)
    assert plan.counts == {1: 16} and plan.mean_threshold == pytest.approx(0.7 * most / 1000)
    assert "overload" in plan.why and "unserved" in plan.why
    none = plan_capacity({k: 0.0 for k in capacity}, DEGREES, TAUS, 16, 5.0)
    assert not none.feasible and none.unserved_rate == 5.0 and "C = 0" in none.why


def test_evaluate_layout_and_rate_zero():
    capacity = random_capacity(np.random.default_rng(3))
    plan = plan_capacity(capacity, DEGREES, TAUS, 16, 6.0)
    again = evaluate_layout(capacity, plan.counts, TAUS, 6.0, num_devices=16)
    assert again.objective == pytest.approx(plan.objective) and again.counts == plan.counts
    assert again.mean_threshold == pytest.approx(plan.mean_threshold)
    empty = evaluate_layout(capacity, {}, TAUS, 6.0)
    assert not empty.feasible and empty.unserved_rate == 6.0 and "no instance" in empty.why
    idle = plan_capacity(capacity, DEGREES, TAUS, 16, 0.0)
    assert idle.feasible and idle.unserved_rate == 0.0 and idle.mean_threshold == max(TAUS)


def test_solve_time_at_64_devices():
    """The gate is loose (bench/planner_solve.py measures: milliseconds); it catches a blow-up."""
    import time
    capacity = random_capacity(np.random.default_rng(5))
    t = time.perf_counter()
    plan = plan_capacity(capacity, DEGREES, TAUS, 64, 40.0)
    plan_transition([Slot(node, g, 1) for node in range(8) for g in range(8)], plan.counts, 8, 8)
    assert time.perf_counter() - t < 1.0


# ---- stage 2 ----
def test_stage2_keeps_the_most_instances_the_counts_allow():
    current = [Slot(node, start, 2) for node in range(2) for start in (0, 2, 4, 6)]      # 8 x TP2 on 2 x 8
    t = plan_transition(current, {2: 6, 4: 1}, 8, 2)
    assert len(t.kept) == 6 and len(t.dissolved) == 2 and len(t.new) == 1 and t.new[0].size == 4
    assert set(t.disrupted_devices) == set(t.new[0].devices(8)) == set(t.regrouped_devices)
    busy = plan_transition(current, {2: 6, 4: 1}, 8, 2, active=[5, 5, 0, 0, 5, 5, 5, 5])
    assert sorted(busy.dissolved) == [Slot(0, 4, 2), Slot(0, 6, 2)]            # the idle pair merges
    assert busy.moved_requests == 0
    assert plan_transition(current, {2: 8}, 8, 2).cost == 0.0
    assert slot_of([10, 11], 8) == Slot(1, 2, 2)
    with pytest.raises(ValueError):
        plan_transition(current, {8: 3}, 8, 2)                                     # 24 GPUs on 16
    with pytest.raises(ValueError):
        slot_of([7, 8], 8)                                                         # across nodes


def random_packing(rng, gpus_per_node, num_nodes, aligned=True):
    slots = []
    for node in range(num_nodes):
        g = 0
        while g < gpus_per_node:
            sizes = [d for d in DEGREES if g + d <= gpus_per_node and (g % d == 0 or not aligned)]
            d = int(rng.choice(sizes))
            if rng.random() < 0.15:
                g += 1                                                             # an idle GPU
                continue
            slots.append(Slot(node, g, d))
            g += d
    return slots


def brute_force_transition(current, weight, target, gpus_per_node, num_nodes):
    slots = candidate_slots(gpus_per_node, num_nodes, [d for d, n in target.items() if n])
    best = [np.inf]

    def rec(k, used, counts, chosen):
        if any(counts[d] > target.get(d, 0) for d in counts):
            return
        if k == len(slots):
            if all(counts.get(d, 0) == n for d, n in target.items()):
                best[0] = min(best[0], sum(w for s, w in zip(current, weight) if s not in chosen))
            return
        s = slots[k]
        devs = set(s.devices(gpus_per_node))
        if not devs & used:
            counts[s.size] = counts.get(s.size, 0) + 1
            rec(k + 1, used | devs, counts, chosen | {s})
            counts[s.size] -= 1
        rec(k + 1, used, counts, chosen)
    rec(0, frozenset(), {}, frozenset())
    return best[0]


def test_stage2_equals_brute_force():
    rng = np.random.default_rng(1)
    for case in range(60):
        gpus_per_node, num_nodes = ((8, 1), (4, 2), (4, 1), (2, 3))[case % 4]
        current = random_packing(rng, gpus_per_node, num_nodes, aligned=case % 5 != 0)
        target = {}
        for s in random_packing(rng, gpus_per_node, num_nodes):
            target[s.size] = target.get(s.size, 0) + 1
        active = [int(a) for a in rng.integers(0, 12, len(current))]
        t = plan_transition(current, target, gpus_per_node, num_nodes, active=active, beta=0.1)
        weight = [s.size + 0.1 * a for s, a in zip(current, active)]
        assert t.cost == pytest.approx(brute_force_transition(current, weight, target, gpus_per_node, num_nodes))
        layout = t.layout
        assert sorted(s.size for s in layout) == sorted(d for d, n in target.items() for _ in range(n))
        used = [g for s in layout for g in s.devices(gpus_per_node)]
        assert len(used) == len(set(used)) and all(s.aligned() for s in layout)


# ---- hysteresis and forecast ----
def value(counts, mean, unserved=0.0, rate=10.0):
    return CapacityPlan(counts, {}, {}, rate, mean, unserved, 0.0, 0, unserved == 0.0)


def test_hysteresis():
    capacity = random_capacity(np.random.default_rng(4))
    target = plan_capacity(capacity, DEGREES, TAUS, 16, 5.0)
    current = evaluate_layout(capacity, target.counts, TAUS, 5.0, num_devices=16)
    assert should_regroup(current, target, None, 1000.0, 60.0)[0] is False        # a steady rate: never
    assert should_regroup(current, plan_capacity(capacity, DEGREES, TAUS, 16, 5.0), 0.0, 1e6, 60.0)[0] is False
    ok, why = should_regroup(value({1: 16}, 0.80), value({2: 8}, 0.81), 0.0, 1000.0, 60.0)
    assert not ok and "gain" in why                                                # a small gain: no
    assert should_regroup(value({1: 16}, 0.80), value({2: 8}, 0.85), 0.0, 1000.0, 60.0)[0] is True
    assert should_regroup(value({1: 16}, 0.80), value({2: 8}, 0.85), 970.0, 1000.0, 60.0)[0] is False  # too soon
    assert should_regroup(value({2: 8}, 0.7, 3.0), value({1: 16}, 0.7, 1.0), 990.0, 1000.0, 60.0)[0] is True
    assert should_regroup(value({2: 8}, 0.9), value({1: 16}, 0.95, 1.0), 0.0, 1000.0, 60.0)[0] is False


def test_forecast_rate():
    steady = np.arange(0.25, 60.0, 0.5)                                            # 2 req/s
    assert forecast_rate(steady, 60.0, 60.0) == pytest.approx(2.0)
    burst = np.concatenate([steady, np.linspace(50.0, 60.0, 200, endpoint=False)])  # +20 req/s for 10 s
    assert len(burst) / 60.0 == pytest.approx(5.33, abs=0.01)                      # the mean hides it,
    assert forecast_rate(burst, 60.0, 60.0) == pytest.approx(2 + 0.9 * 20)        # p90 of 12 windows does not
    assert forecast_rate([], 60.0, 60.0) == 0.0
    assert forecast_rate(steady, 60.0, 3.0, window_s=5.0) == pytest.approx(2.0)   # one window: the mean


# ---- the regroup's waves and the prior for unmeasured degrees (engine/) ----
def test_waves_bound_the_devices_out_of_service():
    from dllm_server.cluster.layout import Layout, changes, plan_waves
    cur, tgt = Layout.of_degrees([2] * 8), Layout.of_degrees([8, 8])
    stop, start = changes(cur, tgt)
    assert plan_waves(cur, stop, start) == [(stop, start)]                 # one wave: changes' own slots
    waves = plan_waves(cur, stop, start, max_devices=8)                    # 16 devices, half at a time
    assert [(olds, news) for olds, news in waves] == [({0, 1, 2, 3}, {0: tuple(range(8))}),
                                                      ({4, 5, 6, 7}, {1: tuple(range(8, 16))})]
    cur, tgt = Layout.of_degrees([1] * 8), Layout.of_degrees([4, 2, 1, 1])  # the TP1s on 6 and 7 are kept
    stop, start = changes(cur, tgt)
    for cap in (1, 2, 3, 4, 5, 8):
        waves = plan_waves(cur, stop, start, cap)
        assert set().union(*(o for o, _ in waves)) == stop
        assert sorted(d for _, n in waves for d in n.values()) == sorted(start.values())
        # a wave is a whole group (a new instance with the old ones it takes devices from) and no
        # larger than the cap unless one group is
        for olds, news in waves:
            devs = {g for w in olds for g in cur.instances[w]} | {g for n in news.values() for g in n}
            assert len(devs) <= max(cap, 4)
            assert {g for n in news.values() for g in n} <= {g for w in olds for g in cur.instances[w]}
        slots = [w for _, n in waves for w in n]
        assert len(slots) == len(set(slots))                               # each slot once
        seen: set = set()
        for olds, news in waves:                  # a new instance never takes a slot a later wave frees
            seen |= olds
            assert all(w in seen or w >= len(cur.instances) for w in news)


def test_the_prior_speedup_is_sublinear_and_measured_degrees_keep_their_model():
    from types import SimpleNamespace

    from dllm_server.cluster.planner import degree_models, tp_speedup
    assert tp_speedup(1, 0.4) == 1.0 and tp_speedup(8, 0.0) == 8.0
    assert [round(tp_speedup(d, 0.4), 2) for d in (2, 4, 8)] == [1.43, 1.82, 2.11]   # cluster_level.md 6.2's batch-32 row

    class Model:
        ready = True

        def __init__(self, s):
            self.s = s

        def predict(self, x):
            return self.s
    load = SimpleNamespace(models={0: Model(0.02)})                      # one TP2 instance measured, 20 ms
    measured: dict = {}
    m = degree_models(load, {0: 2}, [1, 2, 4, 8], measured, serial_share=0.4)
    assert m[2].predict(None) == 0.02 and measured == {2: load.models[0]}
    assert m[1].predict(None) == pytest.approx(0.02 * tp_speedup(2, 0.4))
    assert m[8].predict(None) == pytest.approx(0.02 * tp_speedup(2, 0.4) / tp_speedup(8, 0.4))
    load.models = {}                                                     # TP2 gone: its model stays
    assert degree_models(load, {}, [2], measured, 0.4)[2].predict(None) == 0.02
