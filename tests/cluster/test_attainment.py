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
    latency, chosen, served, _, (p_wait, _) = m.at_load(1e-4, 0.0, 0)
    assert served == 1.0 and p_wait < 1e-3
    fits = m.alone <= 0.3 + 1e-9
    want = np.where(fits.any(axis=1), np.argmax(fits, axis=1), len(TAUS) - 1)
    assert chosen.tolist() == want.tolist()
    assert latency == pytest.approx(m.alone[np.arange(len(chosen)), chosen], rel=1e-3)
    # a cap holds every request at or below it
    _, capped, *_ = m.at_load(1e-4, 0.0, 2)
    assert capped.min() >= 2


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
