"""The periodic cluster planner of the front (`--reconfigure`, DiLaServe's two-stage ILP, live):
every `reconfigure_period_s` it forecasts the arrival rate, builds the capacity table from the
live instances' step-time models, solves stage 1 (cluster/layout_ilp.py) for the layout that
maximises the mean threshold, compares it with the current layout's own value (hysteresis:
policy/planner.should_regroup, so a steady load never regroups), and returns the degrees to
regroup into, or None. Bursts shorter than a period are load control's (policy/slo.py).

Degrees no instance runs yet are priced from a measured model scaled by a sub-linear speed-up,
a named prior (`tp_speedup`: Amdahl's law with the share `reconfigure_prior_serial_share` of a
degree-1 step that TP does not shorten: all-reduces, the replicated head and sampling, the host;
the linear 1/d of the first version priced TP8 at 1.8x what it measured in the simulator). A
degree measured once is priced by its own model from then on: PlannerState keeps the latest
fitted model of every degree that ran. Every decision, taken or not, is logged and kept for
/metrics.

The table's inputs, from the policy: forwards per request at each threshold from the blocks that
ran at it (`planning_forwards`), the canvas of a seated request (SLOPolicy.seated_canvas: finished requests'
canvases weighted by their forwards, as the table wants; the live requests' mean before any finished), the mean SLO (paired with the mean request's forwards: with SLOs that grow with a
request's length, the median SLO against the mean forwards would undercount the budget), and the
workers' token budget (it bounds the re-prefills an iteration takes).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ..config import tp_degree_error
from .capacity_table import capacity_table, from_step_time_model
from .layout_ilp import evaluate_layout, forecast_rate, plan_capacity, should_regroup

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
    measured: dict = field(default_factory=dict)  # degree -> the latest fitted step-time model of one that ran


def tp_speedup(degree: int, serial_share: float) -> float:
    """The prior's step-time speed-up of degree d over degree 1: 1 / (s + (1 - s) / d) (Amdahl, s
    the share of a step TP does not shorten; s = 0 is the linear d)."""
    return 1.0 / (serial_share + (1.0 - serial_share) / degree)


def degree_models(load, instances: dict[int, int], degrees: list[int],
                  measured: dict[int, object] | None = None, serial_share: float = 0.0) -> dict[int, object] | None:
    """{degree: step-time model}: a live instance's own where one runs that degree, else the one
    last measured at that degree (`measured`, updated here), else the prior: the degree-1 model
    (measured, or the lowest measured degree's scaled to degree 1) sped up by tp_speedup(d,
    serial_share). None before any instance has a fitted model."""
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
    """F_j for each threshold: `blocks` x the forwards a block took at tau_j where finished
    blocks ran at it (SLOPolicy.block_forwards), else the admission estimate (`new_work`, which
    the fallback estimator prices alike at every threshold), kept between the observed values (a
    lower threshold never needs more forwards than a higher one); at least one per block."""
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
    rate = forecast_rate(arrivals, now, config.reconfigure_period_s)
    slo_s = float(np.mean(policy.budgets)) if policy.budgets else (config.default_slo_ms or 10_000.0) / 1e3
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
