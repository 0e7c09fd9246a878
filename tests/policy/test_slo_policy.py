"""The SLO policy's pure parts: threshold selection, load control, the step-time model, the tree
predictor's export, the request progress features."""
import numpy as np
import pytest

from dllm_server.costmodel.worker_speed import capacity_rate
from dllm_server.policy.load_control import LoadController, demand_rate
from dllm_server.policy.predictor import SimpleEstimator, TreeEnsemble, export_hist_gbm
from dllm_server.policy.progress import FEATURES, feature_row
from dllm_server.costmodel.step_time import StepTimeModel, features, fit
from dllm_server.policy.thresholds import allowed, choose_threshold, remaining_seconds

CANDS = (0.95, 0.9, 0.8, 0.7, 0.6, 0.5)


# ---- threshold selection ----
def test_highest_threshold_that_fits_the_budget():
    secs = {0.95: 3.0, 0.9: 2.5, 0.8: 2.0, 0.7: 1.5, 0.6: 1.2, 0.5: 1.0}
    assert choose_threshold(CANDS, secs, 2.2, cap=0.95, floor=0.5) == 0.8
    assert choose_threshold(CANDS, secs, 10.0, cap=0.95, floor=0.5) == 0.95
    assert choose_threshold(CANDS, secs, 0.5, cap=0.95, floor=0.5) == 0.5          # none fits: the lowest allowed
    assert choose_threshold(CANDS, secs, 0.5, cap=0.95, floor=0.7) == 0.7          # never below the floor
    assert choose_threshold(CANDS, secs, 10.0, cap=0.8, floor=0.5) == 0.8          # never above the cap
    assert choose_threshold(CANDS, secs, None, cap=0.9, floor=0.5) == 0.9          # no SLO: the highest allowed
    assert allowed(CANDS, cap=0.4, floor=0.5) == (0.5,)                            # a cap below the floor
    assert remaining_seconds(3, 10, 2, 0.01, 0.05) == pytest.approx(0.23)


# ---- load control ----
def test_demand_and_capacity():
    work = np.array([[10.0, 6.0], [20.0, 12.0]])
    assert demand_rate(work, np.array([2.0, 0.1]), 1.0).tolist() == [25.0, 15.0]   # budgets below 1 s count as 1 s
    # iteration time 10 ms + 1 ms per request: the best batch gives 64 / 74 ms
    assert capacity_rate(lambda n: 0.010 + 0.001 * n, 64) == pytest.approx(64 / 0.074)


def test_load_control_lowers_at_once_raises_slowly_and_settles():
    c = LoadController(CANDS)
    capacity = 100.0
    demand = np.array([200.0, 160.0, 120.0, 85.0, 70.0, 60.0])      # fits (<= 90) from 0.7 down
    assert c.update(demand, capacity) == 0.7
    for _ in range(50):                                             # a steady load: no oscillation
        assert c.update(demand, capacity) == 0.7
    demand = demand / 3                                             # load falls: one step per update
    caps = [c.update(demand, capacity) for _ in range(5)]
    assert caps == [0.8, 0.9, 0.95, 0.95, 0.95]
    assert c.update(np.full(6, 1000.0), capacity) == 0.5            # overload: the floor, never below
    borderline = np.array([95.0, 88.0, 80.0, 70.0, 60.0, 50.0])     # 0.9 fits, 0.95 would not
    c = LoadController(CANDS, cap_index=1)
    assert [c.update(borderline, capacity) for _ in range(10)] == [0.9] * 10


# ---- step-time model ----
def test_step_time_model_recovers_a_synthetic_cost_and_reports_its_error():
    rng = np.random.default_rng(0)
    m = StepTimeModel(refit_every=8)
    true = lambda d, k, p, q: 0.002 + 2e-5 * d + 1e-6 * k + 4e-5 * p + 3e-11 * q      # noqa: E731
    for _ in range(300):
        d, k = rng.integers(1, 64) * 32, rng.integers(1, 64) * 300
        p = rng.choice([0, 0, 256, 1024])
        q = p * p
        m.add(features(d, k, p, q), true(d, k, p, q) * rng.uniform(0.97, 1.03))
    for d, k, p in ((32, 300, 0), (2048, 19200, 0), (512, 4000, 1024)):
        assert m.predict(features(d, k, p, p * p)) == pytest.approx(true(d, k, p, p * p), rel=0.05)
    assert m.mean_abs_rel_error() < 0.05
    coef = fit(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]), np.array([3.0, 2.0, 1.0]))
    assert (coef >= 0).all()                       # more work never predicts less time


# ---- the predictor ----
def test_exported_trees_predict_like_sklearn():
    sklearn = pytest.importorskip("sklearn.ensemble")
    rng = np.random.default_rng(1)
    x = rng.random((600, 5))
    x[rng.random((600, 5)) < 0.05] = np.nan                           # missing values take their branch
    y = 3 * np.nan_to_num(x[:, 0]) + np.sin(5 * np.nan_to_num(x[:, 1])) + (x[:, 2] > 0.5)
    model = sklearn.HistGradientBoostingRegressor(max_iter=40, max_depth=5).fit(x, y)
    ours = TreeEnsemble.from_dict(export_hist_gbm(model))
    np.testing.assert_allclose(ours.predict(x), model.predict(x), rtol=1e-5, atol=1e-4)   # leaves kept to 6 digits


def test_simple_estimator_is_pessimistic_until_it_sees_a_stop():
    from dllm_server.policy.progress import Progress
    p = Progress(prompt_len=10, max_tokens=128, block_length=32, num_blocks=4, stop_ids=frozenset({1}),
                 block_index=1, step=3, masked_in_block=16, committed_last=4, answer_masked=100, forwards=12,
                 finished_blocks=[8], summary=(0.8, 0.3, 0.99, 0.6, 0.8, 0.9, 9, 8, 6, 4, 3, 2))
    x = np.asarray([feature_row(p, 0.9, CANDS)])
    assert len(x[0]) == len(FEATURES) and x[0][FEATURES.index("clear_tau")] == 8
    out = SimpleEstimator().predict(x)
    assert out["block_rem"][0] == 4 and out["fut_blocks"][0] == 2 and out["fut_forwards"][0] == 16
    p.eos_seen = True
    assert SimpleEstimator().predict(np.asarray([feature_row(p, 0.9, CANDS)]))["fut_blocks"][0] == 0


def test_batched_choice_equals_one_at_a_time():
    from dllm_server.policy.thresholds import choose_indices
    rng = np.random.default_rng(3)
    secs = np.sort(rng.random((50, 6)), axis=1)[:, ::-1]          # higher thresholds take longer
    budgets = rng.random(50)
    budgets[::7] = np.inf
    for cap, floor in ((0.95, 0.5), (0.8, 0.6), (0.5, 0.5)):
        got = choose_indices(CANDS, secs, budgets, cap, floor)
        ok = allowed(CANDS, cap, floor)
        for r in range(50):                                       # the rule, written out plainly
            want = next((c for c, t in zip(CANDS, secs[r]) if c in ok and t <= budgets[r]), ok[-1])
            assert CANDS[got[r]] == want


def test_capacity_within_the_slo_and_a_cap_per_candidate():
    t = lambda n: 0.0077 + 0.0027 * n          # noqa: E731  (the demo model's decode step on this CPU)
    assert capacity_rate(t, 64, max_iteration_s=0.518 / 33) == pytest.approx(2 / t(2))   # 33 forwards in 518 ms
    assert capacity_rate(t, 64, max_iteration_s=0.001) == pytest.approx(1 / t(1))        # batch 1 always counts
    c = LoadController(CANDS)
    capacity = np.array([191.0, 200, 230, 250, 270, 281])      # lower caps: fewer forwards, bigger batches fit
    demand = np.array([264.0, 250, 210, 180, 150, 128])        # 8 req/s x forwards at each cap
    assert c.update(demand, capacity) == 0.7                   # the highest cap with demand <= 90 % of capacity


# ---- the work ahead (issue 33) ----
def _brute_force_decode_seconds(F, others_f, unit, canvas, others_canvas):
    """Iteration by iteration: every request with forwards left advances by one."""
    t, left = 0.0, list(others_f)
    for _ in range(F):
        t += unit.iteration_s + unit.row_s(np.asarray(canvas))
        for i, f in enumerate(left):
            if f > 0:
                t += unit.row_s(np.asarray(others_canvas[i]))
                left[i] = f - 1
    return t


def test_queued_seconds_is_processor_sharing_with_recompute_steps_priced_apart():
    from dllm_server.costmodel.work_ahead import Others, UnitCosts, queued_seconds
    rng = np.random.default_rng(5)
    unit = UnitCosts(iteration_s=0.004, row_tokens_s=0.002, key_s=1e-6, prefill_token_s=5e-5, prefill_sq_s=1e-8)
    for _ in range(50):
        n = int(rng.integers(0, 30))
        f = rng.integers(1, 80, n).astype(float)
        canvas = rng.integers(50, 400, n).astype(float)
        F = np.array([5.0, 20.0, 60.0])
        no_recompute = Others(f, np.zeros(n), canvas, np.ones(n))
        got = queued_seconds(F, np.zeros(3), 120.0, no_recompute, unit)
        want = [_brute_force_decode_seconds(int(x), f, unit, 120.0, canvas) for x in F]
        np.testing.assert_allclose(got, want, rtol=1e-12)
    # re-prefills: all of a request's that land before this one ends, each at its canvas's price
    one = Others(np.array([10.0]), np.array([2.0]), np.array([100.0]), np.array([1.0]))
    base = queued_seconds(np.array([10.0, 5.0]), np.array([0.0, 0.0]), 100.0, Others(*[np.array([10.0]),
                          np.zeros(1), np.array([100.0]), np.ones(1)]), unit)
    extra = queued_seconds(np.array([10.0, 5.0]), np.array([0.0, 0.0]), 100.0, one, unit) - base
    np.testing.assert_allclose(extra, [2 * unit.recompute_s(100.0), 1 * unit.recompute_s(100.0)])   # all, half
    # a request counted among the others at its last decision is not counted twice
    me = Others(np.array([10.0]), np.array([1.0]), np.array([100.0]), np.array([1.0]))
    alone = queued_seconds(np.array([10.0]), np.array([1.0]), 100.0, Others.empty(), unit)
    np.testing.assert_allclose(queued_seconds(np.array([10.0]), np.array([1.0]), 100.0, me, unit, own=(10.0, 1.0, 1.0)),
                               alone)


def test_a_threshold_above_the_default_needs_slack_and_no_cap():
    from dllm_server.policy.thresholds import choose_indices
    secs = np.array([[8.0, 7.0, 6.0, 5.0, 4.0, 3.0]])           # 0.95 .. 0.5
    pick = lambda budget, cap=0.95: CANDS[int(choose_indices(CANDS, secs, np.array([budget]), cap, 0.5, 0.9, 0.3)[0])]  # noqa: E731
    assert pick(100.0) == 0.95                                   # plenty of slack
    assert pick(10.0) == 0.9                                     # 0.95 fits (8 <= 10) but not with 30 % to spare
    assert pick(8.0 / 0.7) == 0.95                               # exactly the slack
    assert pick(100.0, cap=0.9) == 0.9                           # load control caps: never above the default
    shared = CANDS[int(choose_indices(CANDS, secs, np.array([100.0]), 0.95, 0.5, 0.9, 0.3, np.array([False]))[0])]
    assert shared == 0.9                                         # its worker runs others too: never above the default
    assert pick(6.5) == 0.8 and pick(1.0) == 0.5                 # below the default: the plain rule
    no_rule = CANDS[int(choose_indices(CANDS, secs, np.array([10.0]), 0.95, 0.5)[0])]
    assert no_rule == 0.95                                       # (without a default, the old rule)


def test_capacity_counts_a_recompute_step_per_block():
    from dllm_server.costmodel.worker_speed import WorkerLoadModel
    from dllm_server.costmodel.step_time import features
    load = WorkerLoadModel(32)
    for n in (1, 2, 4, 8, 16, 32):                                # cache steps: 5 ms + 1 ms a row
        load.models[0].add(features(32 * n, 256 * n), 0.005 + 0.001 * n)
        load.models[0].add(features(32 * n, 256 * n, 256, 256 ** 2), 0.005 + 0.001 * n + 0.010)   # + a prefill
    one_block = load.capacity(float("inf"), arrival_rate=10.0, blocks_per_request=1.0)
    four_blocks = load.capacity(float("inf"), arrival_rate=10.0, blocks_per_request=4.0)
    assert four_blocks < one_block
    assert load.capacity(float("inf"), 40.0, 1.0) == pytest.approx(four_blocks)   # 4 blocks at 10/s = 40 recomputes/s


def test_arrival_rate_sees_a_burst_within_a_second_and_a_lull_after_the_long_window():
    from dllm_server.policy.load_control import arrival_rate
    steady = [0.125 * k for k in range(81)]                        # 8 req/s for 10 s
    assert arrival_rate(steady, 10.0) == pytest.approx(9.0)       # 9 in the last second (both ends counted)
    burst = steady + [100.0 + 0.001 * k for k in range(40)]       # 40 at once after a quiet spell
    assert arrival_rate(burst, 100.2) == pytest.approx(40.0)      # the 5-s mean alone would say 8
    assert arrival_rate(burst, 103.0) == pytest.approx(8.0)       # the burst has left the short window
    assert arrival_rate(burst, 106.0) == 0.0
    assert arrival_rate([5.0], 5.3) == 1.0 and arrival_rate([], 1.0) == 0.0   # never a rate over < 1 s


class _TauForwards(SimpleEstimator):
    """The simple estimator with forwards that fall with the threshold (a lower tau commits more a
    step), as the trained one predicts them for a threshold-sensitive model."""
    def predict(self, x, targets=None):
        out = super().predict(x, targets)
        tau = x[:, FEATURES.index("tau")]
        return {k: (v * tau if k != "fut_blocks" else v) for k, v in out.items()}


def test_load_control_caps_a_burst_within_one_period_and_forgets_it_after_a_quiet_spell():
    from dllm_server.config import ServerConfig
    from dllm_server.decoding.params import SamplingParams
    from dllm_server.request.state import GenerationOutput, GenerationStats, RequestState
    from dllm_server.costmodel.worker_speed import WorkerLoadModel
    from dllm_server.policy.slo import SLOPolicy
    config = ServerConfig(block_length=8, threshold_policy="slo")
    load = WorkerLoadModel(8)
    for n in (1, 2, 4, 8, 16, 32):                                 # 2 ms + 1 ms a row; + 4 ms with a recompute
        load.models[0].add(features(8 * n, 40 * n), 0.002 + 0.001 * n)
        load.models[0].add(features(8 * n, 40 * n, 40, 40 ** 2), 0.006 + 0.001 * n)
    now = [0.0]
    policy = SLOPolicy(config, _TauForwards(), load, clock=lambda: now[0])

    def arrive(n, seq0):
        out = []
        for i in range(n):
            sp = SamplingParams(max_tokens=32, slo_ms=2000)
            out.append(RequestState(f"r{seq0 + i}", None, [1, 2, 3], sp, sp.resolve(config.block_length, 1), 0, (9,), seq0 + i))
            out[-1].arrived_at = now[0]
        return [p.threshold for p in policy.block_policies([(st, 0) for st in out])]

    assert arrive(1, 0) == [0.95]                                  # alone, slack to spare: above the default
    now[0] = 1.0
    arrive(60, 1)                                                  # a burst: 60 at once
    assert policy.cap == 0.95                                      # nothing measured yet
    now[0] = 1.25                                                  # one control period later
    policy.revise([], now[0])
    assert policy.cap < 0.9, policy.cap                            # the burst's rate is seen at once
    low = policy.cap

    def finish_all():
        for st in list(policy.states.values()):
            out = GenerationOutput(st.request_id, None, [], "", [], "abort", GenerationStats())
            policy.on_finish(st, out, now[0])

    finish_all()                                                   # the burst has ended
    now[0] = 3.0                                                   # quiet, but within the rate's memory:
    arrive(1, 100)                                                 # the next request is still capped
    assert policy.cap == low
    finish_all()
    now[0] = 3.0 + 5.5                                             # quiet past that memory: the cap is forgotten
    [tau] = arrive(1, 200)
    assert policy.cap == 0.95 and tau == 0.95


def test_load_control_raises_only_after_a_calm_spell():
    c = LoadController(CANDS, calm_updates=3)
    capacity = 100.0
    high, low = np.full(6, 1000.0), np.full(6, 10.0)
    assert c.update(high, capacity) == 0.5
    assert [c.update(low, capacity) for _ in range(3)] == [0.5, 0.5, 0.6]       # three calm updates per step up
    assert [c.update(low, capacity) for _ in range(2)] == [0.6, 0.6]
    c.update(np.array([1000.0, 1000.0, 1000.0, 1000.0, 80.0, 60.0]), capacity)    # 0.6 still fits, 0.7 would not
    assert c.cap == 0.6 and c.calm == 0                                            # the calm spell starts again
    assert [c.update(low, capacity) for _ in range(3)] == [0.6, 0.6, 0.7]


def test_a_raise_needs_what_it_costs_the_others_on_its_worker():
    from dllm_server.policy.thresholds import choose_indices
    secs = np.array([[8.0, 7.0, 6.0, 5.0, 4.0, 3.0]] * 2)
    spares = np.array([[False, False, True, True, True, True], [False] * 6])
    pick = choose_indices(CANDS, secs, np.array([100.0, 100.0]), 0.95, 0.7, spares=spares)
    assert [CANDS[j] for j in pick] == [0.8, 0.7]          # the floor always passes, even when nothing is spared


def _policy_on_one_worker():
    from dllm_server.config import ServerConfig
    from dllm_server.costmodel.worker_speed import WorkerLoadModel
    from dllm_server.policy.slo import SLOPolicy
    config = ServerConfig(block_length=8, threshold_policy="slo", load_control=False)
    load = WorkerLoadModel(8)
    for n in (1, 2, 4, 8, 16, 32):                                 # 2 ms + 1 ms a row; + 4 ms with a recompute
        load.models[0].add(features(8 * n, 40 * n), 0.002 + 0.001 * n)
        load.models[0].add(features(8 * n, 40 * n, 40, 40 ** 2), 0.006 + 0.001 * n)
    return SLOPolicy(config, _TauForwards(), load, clock=lambda: 0.0)


def _request(name: str, slo_ms: float, max_tokens: int = 32):
    from dllm_server.decoding.params import SamplingParams
    from dllm_server.request.state import RequestState
    sp = SamplingParams(max_tokens=max_tokens, slo_ms=slo_ms)
    st = RequestState(name, None, [1, 2, 3], sp, sp.resolve(8, 1), 0, (9,), 0)
    st.arrived_at = 0.0
    return st


@pytest.mark.parametrize("slo_ms_of_the_other, expected", [(60_000, 0.9), (69, 0.5), (10, 0.9)])
def test_a_loose_request_gives_up_its_raise_to_a_tight_one_beside_it(slo_ms_of_the_other, expected):
    policy = _policy_on_one_worker()
    other = _request("tight", slo_ms_of_the_other)
    policy.block_policies([(other, 0)])
    policy.where["tight"] = 0                                      # seated on the only worker
    [loose] = policy.block_policies([(_request("loose", 60_000), 0)])
    margin = policy.margins["tight"]
    if slo_ms_of_the_other == 69:
        assert 0 <= margin < 0.002                                 # it meets its SLO with 1-2 ms to spare
    if slo_ms_of_the_other == 10:
        assert margin < 0 and policy.is_hopeless("tight")          # it misses anyway: nothing to protect
    assert loose.threshold == expected


@pytest.mark.parametrize("typical_need, expected", [(0.7, 0.5), (0.5, 0.95)])
def test_no_raise_while_the_typical_admission_barely_fits_alone_at_the_floor(typical_need, expected):
    from dllm_server.policy.slo import CALIBRATION_MIN, TIGHT_MEDIAN
    policy = _policy_on_one_worker()
    first = _request("first", 1_000)
    policy.block_policies([(first, 0)])
    [need] = policy.floor_needs                  # its predicted latency alone at the floor / its SLO
    assert 0 < need < 0.1
    policy.floor_needs.extend([typical_need] * CALIBRATION_MIN)
    policy.work.clear()                          # the first one gone: nothing else on the worker
    assert policy.too_tight == (typical_need > TIGHT_MEDIAN)
    [loose] = policy.block_policies([(_request("loose", 60_000), 0)])
    assert loose.threshold == expected


@pytest.mark.parametrize("block_causal, max_tokens, sizes", [
    (False, 17, (8, 8, 1)), (False, 16, (8, 8)), (False, 3, (3,)),
    (True, 17, (5, 8, 4)), (True, 3, (3,))])          # block-causal: the first block holds the prompt's tail
def test_progress_counts_the_positions_each_block_must_commit(block_causal, max_tokens, sizes):
    from dllm_server.decoding.params import SamplingParams
    from dllm_server.policy.progress import Progress
    from dllm_server.request.state import RequestState
    sp = SamplingParams(max_tokens=max_tokens)
    st = RequestState("r", None, [1, 2, 3], sp, sp.resolve(8, 1, 8 if block_causal else None), 0, (9,), 0)
    p = Progress.start(st)
    assert p.block_sizes == sizes and p.masked_in_block == sizes[0]
    for k in range(1, len(sizes)):
        p.end_block(3)
        assert p.masked_in_block == sizes[k]


def test_a_short_last_block_is_priced_by_its_positions():
    policy = _policy_on_one_worker()
    policy.block_forwards = {0.95: 8.0, 0.9: 6.0, 0.8: 5.0, 0.7: 4.0, 0.6: 3.0, 0.5: 2.0}   # as blocks ran
    full, short = _request("full", 60_000, max_tokens=24), _request("short", 60_000, max_tokens=17)
    policy.block_policies([(full, 0), (short, 0)])
    per_block = np.asarray([8.0, 6.0, 5.0, 4.0, 3.0, 2.0])
    assert policy.work["full"] == pytest.approx(3 * per_block)                 # three blocks of eight
    assert policy.work["short"] == pytest.approx(2 * per_block + 1.0)          # the third commits one position


def test_a_started_block_is_priced_by_the_positions_it_has_left():
    """A first block under way, half its positions committed: with no confidence summary the estimator alone prices
    its rest at a forward a position still masked, and requests whose SLO fitted were flagged hopeless mid-block.
    It is half a block at the forwards blocks took at each candidate."""
    from dllm_server.messages import StepDelta
    policy = _policy_on_one_worker()
    policy.block_forwards = {0.95: 8.0, 0.9: 6.0, 0.8: 5.0, 0.7: 4.0, 0.6: 3.0, 0.5: 2.0}   # as blocks ran
    st = _request("r", 60_000, max_tokens=16)                       # two blocks of eight
    policy.block_policies([(st, 0)])
    st.answer[:4] = [5, 5, 5, 5]
    policy.on_step(st, StepDelta("r", 0, 1, (3, 4, 5, 6), (5, 5, 5, 5), 12), 0, 0.0)
    policy.block_policies([(st, 0)])
    per_block = np.asarray([8.0, 6.0, 5.0, 4.0, 3.0, 2.0])
    assert policy.work["r"] == pytest.approx(per_block / 2 + per_block)    # half of this block, all of the next
    policy.block_policies([(st, 1)])           # the next block's lease: this one at the threshold it runs at
    running = per_block[list(policy.candidates).index(policy.decided["r"][0])]
    assert policy.work["r"] == pytest.approx(running / 2 + per_block)


def test_the_planner_gets_no_slo_class_priced_before_any_block_ran():
    """The simple estimator prices every threshold alike until a block has run at one (pessimistically): such an
    admission would sit in the cluster planner's sample for 256 admissions, a request it thinks no layout serves."""
    policy = _policy_on_one_worker()
    policy.block_policies([(_request("early", 1_000), 0)])
    assert list(policy.floor_needs) and not policy.classes        # the tight rule counts it; the planner does not
    policy.block_forwards = {0.9: 6.0, 0.7: 4.0}                    # blocks have run
    policy.block_policies([(_request("later", 1_000), 0)])
    [(budget, forwards, blocks, canvas)] = policy.classes
    assert budget == 1.0 and blocks == 4 and forwards[0] > forwards[-1]   # priced apart by threshold
