"""The front's periodic cluster planner (docs/reconfiguration.md "The planner loop"): the degrees to regroup into,
or None; unmeasured degrees are priced by a named prior (`tp_speedup`)."""
from __future__ import annotations

import collections
import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np

from ..config import tp_degree_error
from .attainment import Demand, InstanceModel, Prediction, layouts, predict, window_rates
from .capacity_table import capacity_table, from_step_time_model
from .layout_ilp import describe_counts, evaluate_layout, forecast_rate, plan_capacity, should_regroup

log = logging.getLogger(__name__)


class ScaledModel:
    """A step-time model's predictions divided by `factor` (the prior for an unmeasured degree)."""

    def __init__(self, base, factor: float):
        self.base, self.factor = base, factor

    def predict(self, x) -> float:
        return self.base.predict(x) / self.factor


@dataclass
class PlannerState:
    last_change_s: float | None = None
    decisions: int = 0
    regroups: int = 0
    last: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)  # degree -> latest fitted model, so a degree that ran keeps its own
    out_s: float | None = None                    # seconds a wave kept its devices out in the last regroup
    recent: collections.deque = field(default_factory=collections.deque)   # the last periods' window rates
    periods: int = 0                              # periods planned for so far
    sized_for: dict | None = None                 # the starting layout {degree: instances}


def tp_speedup(degree: int, serial_share: float) -> float:
    """The prior's speed-up of degree d over 1 (Amdahl; s is the share of a step TP does not shorten)."""
    return 1.0 / (serial_share + (1.0 - serial_share) / degree)


def degree_models(load, instances: dict[int, int], degrees: list[int],
                  measured: dict[int, object] | None = None, serial_share: float = 0.0) -> dict[int, object] | None:
    """{degree: step-time model}: live, else last measured, else the prior; None before any model is fitted."""
    live = {d: load.models[w] for w, d in sorted(instances.items()) if w in load.models and load.models[w].ready}
    if measured is not None:
        measured.update(live)
    fitted = {**(measured or {}), **live}
    base = fitted.get(1) or next((ScaledModel(m, 1.0 / tp_speedup(d, serial_share))
                                  for d, m in sorted(fitted.items())), None)
    if base is None:
        return None
    return {d: fitted.get(d) or ScaledModel(base, tp_speedup(d, serial_share)) for d in degrees}


def planning_forwards(taus: list[float], new_work, block_forwards: dict[float, float],
                      blocks: float) -> list[float]:
    """F_j per threshold: observed where blocks ran at tau_j, else the estimate clamped monotone between them."""
    obs = {t: blocks * block_forwards[t] for t in taus if t in block_forwards}
    out = []
    for t, w in zip(taus, new_work):
        f = obs.get(t)
        if f is None:
            f = float(w)
            above, below = [v for u, v in obs.items() if u > t], [v for u, v in obs.items() if u < t]
            f = max(min([f, *above]), *below) if below else min([f, *above])
        out.append(max(float(f), blocks))
    return out


def decide(config, policy, load, instances: dict[int, int], heads: tuple[int, int], num_devices: int,
           arrivals: list[float], now: float, state: PlannerState) -> list[int] | None:
    """The degrees to regroup into, or None (and why, in state.last)."""
    degrees = [d for d in (1, 2, 4, 8) if d <= num_devices and tp_degree_error(d, *heads) is None]
    taus = list(policy.candidates)
    models = degree_models(load, instances, degrees, state.measured, config.reconfigure_prior_serial_share)
    new_work = policy.new_work
    state.decisions += 1
    if models is None or new_work is None or not arrivals:
        state.last = {"regroup": False, "why": "no measured instance, admitted request or arrival yet"}
        return None
    if config.reconfigure_planner == "attainment":
        return _by_attainment(config, policy, models, instances, degrees, num_devices, arrivals, now, state)
    rate = forecast_rate(arrivals, now, config.reconfigure_period_s)
    # the mean SLO pairs with the mean request's forwards; a median would undercount length-scaled SLOs
    budgets = [c[0] for c in getattr(policy, "classes", ())]
    slo_s = float(np.mean(budgets)) if budgets else (config.default_slo_ms or 10_000.0) / 1e3
    blocks = max(1.0, policy.blocks_per_request)
    seated = getattr(policy, "seated_canvas", None)
    canvas = int(seated) if seated else int(np.mean([st.prompt_len + st.answer_len for st in policy.states.values()])) \
        if policy.states else config.block_length * 4
    forwards = planning_forwards(taus, new_work, getattr(policy, "block_forwards", {}), blocks)
    row_tokens = config.block_length if config.cache == "dual" else canvas
    table = capacity_table(degrees, taus, from_step_time_model(models, config.block_length), forwards, blocks,
                           canvas, 0.8 * slo_s, config.max_active_decodes, token_budget=config.token_budget,
                           credit_share=config.credit_share, row_tokens=row_tokens)
    target = plan_capacity(table, degrees, taus, num_devices, rate, utilisation=config.load_target)
    current_counts = {d: sum(1 for v in instances.values() if v == d) for d in degrees}
    current = evaluate_layout(table, current_counts, taus, rate, utilisation=config.load_target,
                              num_devices=num_devices)
    go, why = should_regroup(current, target, state.last_change_s, now, config.reconfigure_period_s,
                             config.reconfigure_min_gain)
    layout = sorted((d for d, n in target.counts.items() for _ in range(n)), reverse=True)
    if go and sum(layout) < num_devices:                         # devices the plan leaves idle serve at TP1
        layout += [1] * (num_devices - sum(layout))
    state.last = {"regroup": go, "why": why, "rate": rate, "slo_s": slo_s, "target": layout,
                  "current": sorted(instances.values(), reverse=True),
                  "current_mean_threshold": current.mean_threshold, "target_mean_threshold": target.mean_threshold,
                  "feasible": target.feasible, "forwards": forwards, "canvas": canvas, "blocks": blocks,
                  "table": {f"TP{d} {t:g}": round(c, 3) for (d, t), c in table.items()}}
    log.info("planner: rate %.2f/s, SLO %.2f s: current %s (mean threshold %.3f) vs target %s (%.3f): %s (%s)",
             rate, slo_s, state.last["current"], current.mean_threshold, layout, target.mean_threshold,
             "regroup" if go else "keep", why)
    if not go or sorted(layout) == sorted(instances.values()):
        return None
    state.last_change_s = now
    state.regroups += 1
    return layout


HORIZON_PERIODS = 3     # a regroup's restart is priced against this many periods of the layout it brings
HEADROOM = 3.0          # room to grow: capacity at the load target for 3x the busiest 5-s window of the period
MIN_OUTCOMES = 16       # finished requests with an SLO before the last period's attainment counts


def sample_demand(policy, arrivals: list[float], now: float, period_s: float) -> Demand | None:
    """The SLO policy's recent admissions as SLO classes, and the last period's bursts; None before any."""
    classes = list(getattr(policy, "classes", ()))
    if not classes:
        return None
    blocks = np.maximum(1.0, np.array([c[2] for c in classes]))
    # the policy's predictions at admission, scaled by how they compared with the forwards finished requests ran
    ratios = list(getattr(policy, "forward_ratios", ()))
    scale = float(np.clip(np.median(ratios), 0.5, 2.0)) if len(ratios) >= MIN_OUTCOMES else 1.0
    t = np.asarray(arrivals, dtype=float)
    gaps = np.diff(t[t > now - period_s])
    cv2 = float(gaps.var() / gaps.mean() ** 2) if len(gaps) > 2 and gaps.mean() > 0 else 1.0
    return Demand(budgets_s=np.array([c[0] for c in classes]),
                  forwards=np.maximum(scale * np.stack([c[1] for c in classes]), blocks[:, None]), blocks=blocks,
                  canvases=np.array([c[3] for c in classes], dtype=float), thresholds=tuple(policy.candidates),
                  window_rates=window_rates(t, now, period_s), arrival_cv2=cv2)


def choose(scored: list[tuple[Prediction, dict]], has_room, band: float, at_peak) -> tuple[Prediction, dict]:
    """Among the layouts within `band` of the best attainment (a smaller gain would not pay for a regroup): those
    with room to grow first, then attainment to half a point, then what each would meet at the busiest load
    remembered (to half a point), then the shorter tail. At light load every layout meets nearly every SLO, and
    the few fastest instances would leave no room, or meet less when the load returns."""
    top = max(p.attainment for p, _ in scored)
    near = [(p, lay) for p, lay in scored if p.attainment >= top - band]
    return max(near, key=lambda pl: (has_room(pl[0]), round(pl[0].attainment * 200),
                                     round(at_peak(pl[1]) * 200), -pl[0].tail_s))


def _restart_price(config, inst, demand, current_counts, current, target, num_devices, out_s):
    """(devices that move, the attainment a regroup costs over the horizon): while a wave is out the rest serve the
    load, and what they cannot serve waits for the new layout, which drains it while serving the load."""
    moved = {d: max(0, n - target.get(d, 0)) for d, n in current_counts.items()}
    moved_devices = sum(d * n for d, n in moved.items())
    if not moved_devices:
        return 0, 0.0
    wave_devices = max(1, int(config.reconfigure_wave_share * num_devices))
    waves = -(-moved_devices // wave_devices)
    degraded, left = dict(current_counts), wave_devices
    for d in sorted(moved, reverse=True):
        take = min(moved[d], left // d if left < wave_devices else max(1, left // d))   # a whole instance at least
        degraded[d] -= take
        left -= take * d
    during = predict(degraded, inst, demand, config.load_target)
    out = waves * out_s
    piled = max(0.0, float(np.mean(demand.window_rates)) - during.capacity) * out
    after = predict(target, inst, demand, config.load_target, backlog=piled).attainment
    drained = predict(target, inst, demand, config.load_target).attainment - after     # over one period
    period = config.reconfigure_period_s
    return moved_devices, (max(0.0, current.attainment - during.attainment) * out + max(0.0, drained) * period) / (
        HORIZON_PERIODS * period)


def _measured_attainment(policy, arrivals, now: float, period: float) -> float | None:
    """What the current layout met in the last period, under a load no higher than the period before's (it then
    bounds the layout's prediction from below: never fix what works); None on a rising load or too few outcomes."""
    t = np.asarray(arrivals, dtype=float)
    span = period if len(t) and t.min() <= now - 2 * period else period / 2    # too little history: two halves
    steady = np.sum(t > now - span) <= 1.2 * np.sum((t > now - 2 * span) & (t <= now - span))
    recent = [met for at, met in getattr(policy, "outcomes", ()) if at > now - period]
    return float(np.mean(recent)) if steady and len(recent) >= MIN_OUTCOMES else None


def _sized_for_rate(config, start: dict[int, int], inst, demand: Demand) -> float:
    """The highest steady rate at which the starting layout is predicted to meet at most --reconfigure-min-gain less
    than it meets unloaded, and no more than its capacity at the load target: the load a cluster sized to meet SLOs
    was chosen for (its capacity alone would overstate many small, slow instances)."""
    n = len(demand.window_rates)

    def met(rate: float) -> float:
        return predict(start, inst, dataclasses.replace(demand, window_rates=np.full(n, rate)),
                       config.load_target).attainment
    floor = met(1e-3) - config.reconfigure_min_gain
    lo, hi = 0.0, config.load_target * predict(start, inst, demand, config.load_target).capacity
    if met(hi) >= floor:
        return hi
    for _ in range(10):                       # bisection to 0.1 % of the capacity
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if met(mid) >= floor else (lo, mid)
    return lo


def _remembered_peak(config, state: PlannerState, inst, demand: Demand, current_counts) -> tuple[np.ndarray, str]:
    """The window rates of the busiest of the last `reconfigure_memory_periods` periods, and what it is. Until that
    many have passed, the load the starting layout was sized for counts as one of them: the operator sized the
    cluster for some load, and a light first spell says nothing about the next."""
    memory = config.reconfigure_memory_periods
    if state.sized_for is None:
        state.sized_for = dict(current_counts)
    state.recent.append(demand.window_rates)
    while len(state.recent) > memory:
        state.recent.popleft()
    state.periods += 1
    candidates = [(w, "the busiest recent period") for w in state.recent]
    if state.periods < memory:
        sized = _sized_for_rate(config, state.sized_for, inst, demand)
        candidates.append((np.full(len(demand.window_rates), sized),
                           f"the load {describe_counts(state.sized_for)} was sized for"))
    return max(candidates, key=lambda c: float(np.mean(c[0])))


def _by_attainment(config, policy, models, instances, degrees, num_devices, arrivals, now, state):
    """The layout the attainment model ranks first, if its gain over the current one pays for the restart."""
    period = config.reconfigure_period_s
    demand = sample_demand(policy, arrivals, now, period)
    if demand is None:
        state.last = {"regroup": False, "why": "no request with an SLO admitted yet"}
        return None
    iteration_s = from_step_time_model(models, config.block_length)
    floor = len(demand.thresholds) - 1
    row_tokens = config.block_length if config.cache == "dual" else int(demand.canvases.mean())
    inst = {d: InstanceModel(iteration_s, d, config.max_active_decodes, demand, floor, token_budget=config.token_budget,
                             credit_share=config.credit_share, row_tokens=row_tokens) for d in degrees}
    current_counts = {d: n for d in degrees if (n := sum(1 for v in instances.values() if v == d))}
    current = predict(current_counts, inst, demand, config.load_target)
    peak_rates, peak_name = _remembered_peak(config, state, inst, demand, current_counts)
    peak = dataclasses.replace(demand, window_rates=peak_rates)
    need = max(HEADROOM * float(np.max(demand.window_rates)), float(np.max(peak.window_rates)))

    def has_room(p: Prediction) -> bool:
        return config.load_target * p.capacity >= need
    scored = [(predict(lay, inst, demand, config.load_target), lay) for lay in layouts(num_devices, degrees)]
    best, target = choose(scored, has_room, config.reconfigure_min_gain,
                          lambda lay: predict(lay, inst, peak, config.load_target).attainment)
    out_s = state.out_s if state.out_s is not None else config.reconfigure_restart_s
    moved_devices, price = _restart_price(config, inst, demand, current_counts, current, target, num_devices, out_s)

    def stressed_price() -> float:
        """A move with no attainment gain (for the tail, for room) must be cheap even if the load grows as room to
        grow plans for while its waves are out: the restart priced at HEADROOM x the forecast."""
        hard = dataclasses.replace(demand, window_rates=HEADROOM * demand.window_rates)
        now_hard = predict(current_counts, inst, hard, config.load_target)
        return _restart_price(config, inst, hard, current_counts, now_hard, target, num_devices, out_s)[1]
    measured = _measured_attainment(policy, arrivals, now, period)
    gain = best.attainment - max(current.attainment, measured or 0.0)
    room = has_room(best)
    since = None if state.last_change_s is None else now - state.last_change_s
    at_peak = (predict(current_counts, inst, peak, config.load_target).attainment,
               predict(target, inst, peak, config.load_target).attainment)
    if target == current_counts or not moved_devices:
        go, why = False, f"the best layout is the current one ({describe_counts(current_counts)})"
    elif at_peak[1] < at_peak[0] - config.reconfigure_min_gain:
        go, why = False, (f"at {peak_name} ({float(np.mean(peak.window_rates)):.1f} req/s) it would meet "
                          f"{at_peak[1]:.3f} against {at_peak[0]:.3f}")
    elif since is not None and since < period:
        go, why = False, f"the last change was {since:.3g} s ago (< one period, {period:g} s)"
    elif gain - price >= config.reconfigure_min_gain:
        go, why = True, f"attainment gain {gain:+.3f} - restart price {price:.3f} >= {config.reconfigure_min_gain:g}"
    elif since is not None and since < 2 * period:       # a move for the tail or for room alone: not back and forth
        go, why = False, f"no attainment gain, and the last change was {since:.3g} s ago (< two periods)"
    elif abs(best.attainment - current.attainment) < 0.005 and price < 0.005 and best.tail_s * 1.2 < current.tail_s:
        stressed = stressed_price()
        go = room and stressed < 0.005
        why = f"same attainment, p90 {current.tail_s:.2f} -> {best.tail_s:.2f} s" + (
            "" if room else f", but no room for {HEADROOM:g} x the busiest 5-s window") + (
            "" if stressed < 0.005 else f", but the restart would cost {stressed:.3f} at {HEADROOM:g} x the load")
    elif room and not has_room(current) and price < 0.005 and best.attainment > current.attainment - 0.005 \
            and stressed_price() < 0.005:
        go, why = True, (f"room to grow while it is cheap: capacity {config.load_target * current.capacity:.1f} -> "
                         f"{config.load_target * best.capacity:.1f} req/s for {need:.1f}")
    else:
        go, why = False, f"attainment gain {gain:+.3f} - restart price {price:.3f} < {config.reconfigure_min_gain:g}"
    layout = sorted((d for d, n in target.items() for _ in range(n)), reverse=True)
    state.last = {"regroup": go, "why": why, "rate": float(np.mean(demand.window_rates)),
                  "target": layout, "current": sorted(instances.values(), reverse=True),
                  "current_attainment": current.attainment, "target_attainment": best.attainment,
                  "need": need, "target_room": config.load_target * best.capacity,
                  "measured_attainment": measured,
                  "current_tail_s": current.tail_s, "target_tail_s": best.tail_s, "price": price,
                  "current_mean_threshold": current.mean_threshold, "target_mean_threshold": best.mean_threshold}
    log.info("planner: %.2f req/s: current %s (attainment %.3f, p90 %.2f s) vs best %s (%.3f, %.2f s): %s (%s)",
             state.last["rate"], describe_counts(current_counts), current.attainment, current.tail_s,
             describe_counts(target), best.attainment, best.tail_s, "regroup" if go else "keep", why)
    if not go:
        return None
    state.last_change_s = now
    state.regroups += 1
    return layout
