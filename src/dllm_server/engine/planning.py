"""The periodic cluster planner of the front (`--reconfigure`, DiLaServe's two-stage ILP, live):
every `reconfigure_period_s` it forecasts the arrival rate, builds the capacity table from the
live instances' step-time models, solves stage 1 (policy/planner.py) for the layout that
maximises the mean threshold, compares it with the current layout's own value (hysteresis:
policy/planner.should_regroup, so a steady load never regroups), and returns the degrees to
regroup into, or None. Bursts shorter than a period are load control's (policy/slo.py).

Degrees no instance runs yet are priced from the measured degree-1 model scaled by 1/d, a prior
(on a GPU the all-reduces make it optimistic; a degree measured once is priced by its own model
from then on). Every decision, taken or not, is logged and kept for /metrics.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ..config import tp_degree_error
from ..policy.capacity_table import capacity_table, from_step_time_model
from ..policy.planner import evaluate_layout, forecast_rate, plan_capacity, should_regroup

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
    last: dict = field(default_factory=dict)      # the latest decision, for /metrics and logs


def degree_models(load, instances: dict[int, int], degrees: list[int]) -> dict[int, object] | None:
    """{degree: step-time model}: a live instance's own where one runs that degree, else the
    degree-1 prior. None before any instance has a fitted model."""
    fitted = {d: load.models[w] for w, d in instances.items() if w in load.models and load.models[w].ready}
    base = fitted.get(1) or next((ScaledModel(m, 1.0 / d) for d, m in fitted.items()), None)
    if base is None:
        return None
    return {d: fitted.get(d) or ScaledModel(base, float(d)) for d in degrees}


def decide(config, policy, load, instances: dict[int, int], heads: tuple[int, int], num_devices: int,
           arrivals: list[float], now: float, state: PlannerState) -> list[int] | None:
    """The degrees to regroup into, or None (and why, in state.last)."""
    degrees = [d for d in (1, 2, 4, 8) if d <= num_devices and tp_degree_error(d, *heads) is None]
    taus = list(policy.candidates)
    models = degree_models(load, instances, degrees)
    new_work = policy.new_work
    state.decisions += 1
    if models is None or new_work is None or not arrivals:
        state.last = {"regroup": False, "why": "no measured instance, admitted request or arrival yet"}
        return None
    rate = forecast_rate(arrivals, now, config.reconfigure_period_s)
    slo_s = float(np.median(policy.budgets)) if policy.budgets else (config.default_slo_ms or 10_000.0) / 1e3
    blocks = max(1.0, policy.blocks_per_request)
    canvas = int(np.median([st.prompt_len + st.answer_len for st in policy.states.values()])) if policy.states \
        else config.block_length * 4
    forwards = [max(float(f), blocks) for f in new_work]
    table = capacity_table(degrees, taus, from_step_time_model(models, config.block_length), forwards, blocks,
                           canvas, 0.8 * slo_s, config.max_active_decodes)
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
                  "feasible": target.feasible}
    log.info("planner: rate %.2f/s, SLO %.2f s: current %s (mean threshold %.3f) vs target %s (%.3f): %s (%s)",
             rate, slo_s, state.last["current"], current.mean_threshold, layout, target.mean_threshold,
             "regroup" if go else "keep", why)
    if not go or sorted(layout) == sorted(instances.values()):
        return None
    state.last_change_s = now
    state.regroups += 1
    return layout
