"""The planner's model of a layout (cluster/attainment.py): each formula on a hand-checkable iteration time, the
candidate layouts against brute force, and the predictions' directions (load, speed, pooling, bursts)."""
import itertools

import numpy as np
import pytest

from dllm_server.cluster.attainment import Demand, InstanceModel, layouts, predict, window_rates

TAUS = (0.95, 0.9, 0.8, 0.7)


def linear_iteration(d, rows, keys, prefill_tokens, prefill_sq):
    """10 ms + 1 ms a decode row + 10 us a canvas token, all split d ways."""
    return (0.010 + 0.001 * rows + 1e-5 * prefill_tokens) / d


def demand(rates=(1.0,), budget=2.0, n=50, cv2=1.0, seed=0):
    rng = np.random.default_rng(seed)
    blocks = rng.integers(1, 6, n).astype(float)
    per_block = np.array([12.0, 9.0, 6.0, 4.0])            # forwards a block takes at each threshold
    return Demand(budgets_s=np.full(n, budget), forwards=blocks[:, None] * per_block[None, :], blocks=blocks,
                  canvases=rng.integers(100, 400, n).astype(float), thresholds=TAUS,
                  window_rates=np.asarray(rates, dtype=float), arrival_cv2=cv2)


def model(dem, degree=1, seats=64, token_budget=None):
    return InstanceModel(linear_iteration, degree, seats, dem, len(TAUS) - 1, token_budget=token_budget,
                         credit_share=0.125, row_tokens=32)


def test_layouts_are_every_partition_once():
    got = layouts(16, (1, 2, 4))
    brute = [{d: n for d, n in zip((1, 2, 4), ns) if n}
             for ns in itertools.product(range(17), range(9), range(5)) if ns[0] + 2 * ns[1] + 4 * ns[2] == 16]
    assert sorted(map(sorted, (lay.items() for lay in got))) == sorted(map(sorted, (lay.items() for lay in brute)))
    assert len(got) == 25 and len(layouts(8, (1, 2, 4, 8))) == 10


def test_window_rates_by_hand():
    # windows (0, 5], (5, 10] ending at 10: numpy's bins are [0, 5), [5, 10]
    assert window_rates([0.5, 1.0, 6.0, 9.0, 9.5, 9.9], now_s=10.0, span_s=10.0).tolist() == [2 / 5, 4 / 5]
    assert window_rates([1.0, 2.0], now_s=3.0, span_s=3.0).tolist() == [2 / 5]   # a span under a window: one


def test_scaled_keeps_the_bursts():
    d = demand(rates=(1.0, 3.0)).scaled(4.0)
    assert d.window_rates.tolist() == [2.0, 6.0]
    assert demand(rates=(0.0,)).scaled(2.0).window_rates.tolist() == [2.0]


def test_alone_latency_by_hand():
    dem = demand()
    m = model(dem, degree=2)
    # canvases rounded up to 64 tokens; per block one recompute of the canvas, the rest one-row decodes
    size = -(-dem.canvases // 64) * 64
    pre = (0.010 + 1e-5 * size) / 2
    dec = (0.010 + 0.001 * 1) / 2
    want = dem.blocks[:, None] * pre[:, None] + (dem.forwards - dem.blocks[:, None]) * dec
    assert m.alone == pytest.approx(want)


def test_the_token_budget_bounds_the_fed_batch():
    dem = demand()
    free = model(dem, seats=64)
    assert free.seats.tolist() == [64.0] * 4
    tight = model(dem, seats=64, token_budget=1024)
    c, blocks = int(dem.canvases.mean()), dem.blocks.mean()
    per_seat = blocks * c / dem.forwards.mean(axis=0)                  # recompute tokens a seat needs an iteration
    want = np.where(1024 - (1024 / (per_seat + 32)) * 32 >= 128, 1024 / (per_seat + 32), 128 / per_seat)
    assert tight.seats == pytest.approx(np.minimum(64, np.maximum(1, want)))
    assert tight.capacity < free.capacity
    # the floor's capacity: its fed batch over the mean request's forwards at that batch's iteration time
    j = len(TAUS) - 1
    assert tight.capacity == pytest.approx(tight.seats[j] / (dem.forwards.mean(axis=0)[j] * tight.time(j, tight.seats[j])))


def test_at_light_load_each_request_takes_the_highest_threshold_that_fits():
    dem = demand(budget=0.3)
    m = model(dem)
    load = m.at_load(1e-4, 0.0, 0)
    latency, chosen = load.latency, load.chosen
    assert load.served == 1.0 and load.p_wait < 1e-3
    fits = m.alone <= 0.3 + 1e-9
    want = np.where(fits.any(axis=1), np.argmax(fits, axis=1), len(TAUS) - 1)
    assert chosen.tolist() == want.tolist()
    assert latency == pytest.approx(m.alone[np.arange(len(chosen)), chosen], rel=1e-3)
    # a cap holds every request at or below it
    assert m.at_load(1e-4, 0.0, 2).chosen.min() >= 2


def test_predictions_fall_with_load_and_rise_with_speed():
    base = demand(rates=(1.0,), budget=1.0)
    atts = []
    for rate in (1.0, 10.0, 40.0, 80.0, 160.0):
        dem = base.scaled(rate)
        atts.append(predict({1: 2}, {1: model(dem, token_budget=1024)}, dem).attainment)
    assert atts == sorted(atts, reverse=True) and atts[0] > 0.99 and atts[-1] < 0.5
    dem = base.scaled(60.0)
    slow = predict({1: 2}, {1: model(dem, token_budget=1024)}, dem)
    fast = predict({2: 2}, {2: model(dem, degree=2, token_budget=1024)}, dem)   # same count, half the time
    assert fast.attainment > slow.attainment and fast.tail_s < slow.tail_s
    assert fast.capacity == pytest.approx(2 * model(dem, degree=2, token_budget=1024).capacity)


def test_pooling_and_bursts():
    # the same load per instance: more instances pool into one queue and wait less
    per = model(demand(), token_budget=1024).capacity * 0.8
    one = demand(rates=(per,), budget=0.6)
    four = demand(rates=(4 * per,), budget=0.6)
    p1 = predict({1: 1}, {1: model(one, token_budget=1024)}, one)
    p4 = predict({1: 4}, {1: model(four, token_budget=1024)}, four)
    assert p4.attainment > p1.attainment
    # the same mean load in bursts (a window over capacity leaves a backlog) meets fewer SLOs than steady
    cap = model(demand(), token_budget=1024).capacity
    steady = demand(rates=(cap, cap), budget=0.6)
    bursty = demand(rates=(1.9 * cap, 0.1 * cap), budget=0.6)
    assert predict({1: 1}, {1: model(bursty, token_budget=1024)}, bursty).attainment < \
        predict({1: 1}, {1: model(steady, token_budget=1024)}, steady).attainment


def test_empty_layout_and_no_load():
    dem = demand(rates=(0.0,))
    assert predict({}, {}, dem).attainment == 0.0
    p = predict({1: 1}, {1: model(dem)}, dem)
    assert p.attainment == 1.0 and p.mean_threshold == TAUS[0]


def test_slowdowns_are_the_birth_death_queue_by_hand():
    """One instance whose fed batch is 2: N = 0, 1, 2 requests, then every seat fed (a geometric tail). An arrival
    that finds N others runs at t(1 + N) / t(1) (N / 1 others on one instance, capped at the batch less itself)."""
    import math
    dem = demand(budget=1.0)
    m = model(dem, seats=2)
    j = len(TAUS) - 1
    m.seats[j] = 2.0
    fbar, rate = 10.0, 3.0
    served = [n / (fbar * m.time(j, n)) for n in (1, 2)]             # requests/s at 1 and 2 seated
    lam = rate
    p = [1.0, lam / served[0], lam * lam / (served[0] * served[1])]
    p[2] /= 1.0 - lam / served[1]                                      # N >= 2: the tail
    p = [x / sum(p) for x in p]
    slow = [1.0, m.time(j, 2) / m.time(j, 1), m.time(j, 2) / m.time(j, 1)]
    u = (np.arange(16) + 0.5) / 16
    want = [slow[int(np.searchsorted(np.cumsum(p), x))] for x in u]
    assert m.slowdowns(j, rate, fbar, 1) == pytest.approx(want)
    assert not math.isclose(p[0], 1.0)


def test_company_slows_a_request_even_where_the_mean_batch_is_under_one():
    """Little's law puts the mean batch under one at half the load an instance serves; the requests that arrive
    while another runs still share its iterations. Pooling more instances (least-loaded routing) lowers it."""
    dem = demand(budget=1.0)
    m = model(dem, token_budget=1024)
    j = len(TAUS) - 1
    fbar = float(dem.forwards[:, j].mean())
    assert m.slowdowns(j, 0.0, fbar, 1).tolist() == [1.0] * 16
    half = 0.5 * m.capacity
    means = [m.slowdowns(j, r, fbar, 1).mean() for r in (0.2 * half, half, 1.8 * half)]
    assert 1.0 < means[0] < means[1] < means[2]
    assert m.slowdowns(j, half, fbar, 8).mean() < means[1]


def test_a_request_slowed_past_its_threshold_falls_back_to_the_floor():
    """The policy chooses each block's threshold as it runs: a request misses only where even the floor does not
    fit the slowdown it meets."""
    import dataclasses
    dem = demand(budget=1.0)
    m = model(dem)
    load = m.at_load(1e-4, 0.0, 0)
    floor = m.alone[:, -1]
    slowed = dataclasses.replace(load, slowdowns=np.array([1.0, 1.0, 3.0, 3.0]), p_wait=0.0)
    budgets = np.where(np.arange(len(floor)) % 2 == 0, 1.5 * floor, 3.5 * floor)   # fits at 1x only / at 3x too
    m.demand = dataclasses.replace(dem, budgets_s=budgets)
    assert m.met(slowed, 0.0).tolist() == np.where(np.arange(len(floor)) % 2 == 0, 0.5, 1.0).tolist()


def test_a_backlog_at_the_start_is_served_before_the_new_arrivals():
    """Requests already waiting (a regroup's wave left them) delay the next windows' arrivals until drained."""
    dem = demand(rates=(20.0, 20.0, 20.0), budget=1.0)
    models = {1: model(dem, token_budget=1024)}
    clean = predict({1: 2}, models, dem)
    assert predict({1: 2}, models, dem, backlog=0.0) == clean
    met = [predict({1: 2}, models, dem, backlog=b).attainment for b in (20.0, 60.0, 200.0)]
    assert clean.attainment > met[0] > met[1] > met[2]
