"""DiLaServe's cluster planner, the decision parts (shared/reference/cluster_level.md 4): stage 1,
how many instances of each tensor-parallel degree the devices should form for the forecast rate
(a small MILP), the value of the layout running now (the same problem with its instance counts
fixed), the hysteresis that decides whether regrouping is worth it, and the conservative rate
forecast it plans for. Stage 2 (which GPUs form which instance) is cluster/transition.py
(re-exported here). Pure functions over plain data; scipy (HiGHS through `scipy.optimize.milp`)
is imported only when a plan is solved.

Stage 1, with P = degrees x thresholds and C[d, j] from cluster/capacity_table.py:

    vars  n[d,j] in Z>=0   instances of degree d planned at threshold tau_j
          x[d,j] >= 0      req/s they serve;  u >= 0 req/s left unserved
    max   sum tau_j x[d,j] / lam  -  M u / lam  +  eps sum (rho C[d,j] n[d,j] - x[d,j]) / Z
    s.t.  sum d n[d,j] <= G;   sum x[d,j] + u = lam;   x[d,j] <= rho C[d,j] n[d,j]

The first term is the mean threshold served; M (1e3) puts serving everything first, so an
overload returns the layout that serves the most; the last term prefers spare capacity among
equal plans, Z = G max rho C[d,j] / d (the most the devices could serve) bounds it by eps (1e-4)
in mean-threshold units, so it never buys spare capacity with a visible threshold loss.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from .transition import Slot, Transition, plan_transition  # noqa: F401  (stage 2, importable from here too)

UNSERVED_PENALTY = 1e3      # M: a req/s unserved weighs more than any threshold gain
SPARE_WEIGHT = 1e-4         # eps: the tie-break's largest possible weight, in mean-threshold units
OBJECTIVE_SCALE = 1e4


@dataclass(frozen=True)
class CapacityPlan:
    counts: dict[int, int]                          # instances per degree (degrees with none left out)
    instances: dict[tuple[int, float], int]         # n[d, tau]
    rates: dict[tuple[int, float], float]           # x[d, tau], req/s
    rate: float                                     # the forecast planned for, req/s
    mean_threshold: float                           # sum tau x / rate (the highest threshold at rate 0)
    unserved_rate: float                            # u, req/s
    spare_rate: float                               # sum rho C n - x, req/s
    devices_used: int
    feasible: bool                                  # everything served within the SLO at the utilisation
    why: str = ""                                   # what is short when not feasible
    objective: float = field(default=0.0, repr=False)

    @property
    def served_rate(self) -> float:
        return self.rate - self.unserved_rate


def describe_counts(counts: Mapping[int, int]) -> str:
    return " + ".join(f"{n} x TP{d}" for d, n in sorted(counts.items()) if n) or "no instance"


def plan_capacity(capacity: Mapping[tuple[int, float], float], degrees: Sequence[int], thresholds: Sequence[float],
                  num_devices: int, rate: float, utilisation: float = 0.7, *,
                  unserved_penalty: float = UNSERVED_PENALTY, spare_weight: float = SPARE_WEIGHT) -> CapacityPlan:
    """Stage 1: the instances per degree (and per threshold level) that maximise the mean threshold
    for `rate` req/s on `num_devices` GPUs; when no layout serves it all, the one that serves the
    most, with `feasible` False and `why`."""
    return _solve(capacity, list(degrees), list(thresholds), rate, utilisation, num_devices, None,
                  unserved_penalty, spare_weight)


def evaluate_layout(capacity: Mapping[tuple[int, float], float], counts_by_degree: Mapping[int, int],
                    thresholds: Sequence[float], rate: float, utilisation: float = 0.7,
                    num_devices: int | None = None, *, unserved_penalty: float = UNSERVED_PENALTY,
                    spare_weight: float = SPARE_WEIGHT) -> CapacityPlan:
    """Stage 1's value of a given layout (the one running now): the same problem with each degree's
    instance count fixed (only their split over the levels and the rates are free). Pass the
    cluster's `num_devices` so the tie-break is scaled as plan_capacity's: then the plan's own
    counts evaluate to the plan's value exactly."""
    counts = {d: int(n) for d, n in counts_by_degree.items() if n}
    devices = sum(d * n for d, n in counts.items())
    return _solve(capacity, sorted(counts), list(thresholds), rate, utilisation,
                  devices if num_devices is None else num_devices, counts, unserved_penalty, spare_weight)


def _solve(capacity, degrees, thresholds, rate, utilisation, num_devices, fixed, unserved_penalty,
           spare_weight) -> CapacityPlan:
    from scipy.optimize import Bounds, LinearConstraint, milp
    if rate < 0 or num_devices < 0 or not 0 < utilisation <= 1:
        raise ValueError(f"rate {rate}, num_devices {num_devices}, utilisation {utilisation}")
    pairs = [(d, tau) for d in degrees for tau in thresholds]
    k = len(pairs)
    cap = np.array([utilisation * capacity.get(p, 0.0) for p in pairs], dtype=float)
    deg = np.array([d for d, _ in pairs], dtype=float)
    tau = np.array([t for _, t in pairs], dtype=float)
    per_gpu = max((utilisation * c / d for (d, _), c in capacity.items() if c > 0), default=0.0)
    norm = max(num_devices * per_gpu, 1e-12)
    lam = max(rate, 1e-12)
    # variables [n (k), x (k), u]; milp minimises, so the objective's negative, scaled up: HiGHS stops
    # at an absolute gap of 1e-6, which would blur the tie-break (its values differ by ~1e-7)
    c = OBJECTIVE_SCALE * np.concatenate([-spare_weight * cap / norm, -tau / lam + spare_weight / norm,
                                          [unserved_penalty / lam]])
    if fixed is None:
        n_hi = np.where(cap > 0, np.floor(num_devices / deg), 0.0)     # an instance that serves nothing: never
    else:
        n_hi = np.array([float(fixed[d]) for d, _ in pairs])
    lo = np.zeros(2 * k + 1)
    hi = np.concatenate([n_hi, np.full(k, np.inf), [np.inf]])
    rows = [np.concatenate([np.zeros(k), np.ones(k), [1.0]])]           # sum x + u = rate
    row_lo, row_hi = [rate], [rate]
    if fixed is None:                                                  # sum d n <= devices
        rows.append(np.concatenate([deg, np.zeros(k + 1)]))
        row_lo.append(0.0)
        row_hi.append(float(num_devices))
    else:                                                              # sum_j n[d, j] = counts[d]
        for d in degrees:
            rows.append(np.concatenate([[1.0 if e == d else 0.0 for e, _ in pairs], np.zeros(k + 1)]))
            row_lo.append(float(fixed[d]))
            row_hi.append(float(fixed[d]))
    link = np.hstack([-np.diag(cap), np.eye(k), np.zeros((k, 1))])     # x - rho C n <= 0
    a = np.vstack([np.array(rows), link])
    b_lo = np.concatenate([row_lo, np.full(k, -np.inf)])
    b_hi = np.concatenate([row_hi, np.zeros(k)])
    res = milp(c, constraints=LinearConstraint(a, b_lo, b_hi), bounds=Bounds(lo, hi),
               integrality=np.concatenate([np.ones(k), np.zeros(k + 1)]),
               options={"mip_rel_gap": 0.0})
    if res.x is None:
        raise RuntimeError(f"stage 1 MILP: {res.message}")       # u absorbs any rate: never infeasible
    n = np.rint(res.x[:k]).astype(int)
    x = np.clip(res.x[k:2 * k], 0.0, None)
    u = max(0.0, float(res.x[-1]))
    if u <= 1e-7 * max(1.0, rate):                   # HiGHS's feasibility tolerance
        u = 0.0
    counts: dict[int, int] = {}
    for (d, _), m in zip(pairs, n):
        if m:
            counts[d] = counts.get(d, 0) + int(m)
    plan = CapacityPlan(
        counts=counts, instances={p: int(m) for p, m in zip(pairs, n) if m},
        rates={p: float(v) for p, v in zip(pairs, x) if v > 1e-12}, rate=rate,
        mean_threshold=float(tau @ x / rate) if rate > 0 else max(thresholds, default=0.0),
        unserved_rate=u, spare_rate=max(0.0, float(cap @ n - x.sum())), devices_used=int(deg @ n), feasible=u == 0.0,
        objective=-float(res.fun) / OBJECTIVE_SCALE)
    return plan if plan.feasible else _with_why(plan, capacity, thresholds, num_devices, utilisation, fixed)


def _with_why(plan: CapacityPlan, capacity, thresholds, num_devices, utilisation, fixed) -> CapacityPlan:
    if not any(c > 0 for c in capacity.values()):
        why = "no instance of any degree meets the SLO at any threshold (C = 0 everywhere: even batch 1 misses it)"
    else:
        where = f"the layout ({describe_counts(fixed)})" if fixed is not None else f"{num_devices} devices"
        why = (f"overload: {plan.rate:.4g} req/s forecast, {where} can serve at most {plan.served_rate:.4g} req/s "
               f"within the SLO at utilisation {utilisation:g} ({describe_counts(plan.counts)}, down to threshold "
               f"{min((t for _, t in plan.instances), default=min(thresholds)):g}); "
               f"{plan.unserved_rate:.4g} req/s unserved")
    return replace(plan, why=why)


def should_regroup(current_value: CapacityPlan, target_value: CapacityPlan, last_change_s: float | None,
                   now_s: float, period_s: float, min_gain: float = 0.02) -> tuple[bool, str]:
    """Hysteresis (cluster_level.md 4.3), on the current layout's value (evaluate_layout) and the
    target's (plan_capacity): regroup at once when the current layout leaves load unserved and the
    target serves more; otherwise only for a mean-threshold gain of at least `min_gain`, serving no
    less, and at least one period after the last change. Regrouping drains instances for about a
    block and restarts processes, so a small gain does not pay for it."""
    tol = 1e-6 * max(1.0, current_value.rate)
    if current_value.counts == target_value.counts:
        return False, f"the target layout is the current one ({describe_counts(current_value.counts)})"
    if current_value.unserved_rate > tol and target_value.unserved_rate < current_value.unserved_rate - tol:
        return True, (f"overload: the current layout leaves {current_value.unserved_rate:.4g} req/s unserved, "
                      f"the target {target_value.unserved_rate:.4g}")
    if target_value.unserved_rate > current_value.unserved_rate + tol:
        return False, "the target serves less than the current layout"
    gain = target_value.mean_threshold - current_value.mean_threshold
    if gain < min_gain:
        return False, f"mean-threshold gain {gain:+.4f} < {min_gain:g}"
    since_s = None if last_change_s is None else now_s - last_change_s
    if since_s is not None and since_s < period_s:
        return False, f"gain {gain:+.4f}, but the last change was {since_s:.3g} s ago (< one period, {period_s:g} s)"
    return True, f"mean-threshold gain {gain:+.4f} >= {min_gain:g}"


def forecast_rate(arrival_times_s: Sequence[float], now_s: float, period_s: float, window_s: float = 5.0) -> float:
    """The rate to plan the next period for, req/s: the larger of the mean rate over the last period
    and the 90th percentile of its `window_s` window rates (a burst inside the period counts, not
    only its average: conservative)."""
    if period_s <= 0:
        raise ValueError(f"period_s must be > 0, got {period_s}")
    t = np.asarray(arrival_times_s, dtype=float)
    t = t[(t > now_s - period_s) & (t <= now_s)]
    mean = len(t) / period_s
    num_windows = int(period_s // window_s) if window_s > 0 else 0
    if num_windows < 2:
        return mean
    edges = now_s - window_s * np.arange(num_windows, -1, -1)     # the last num_windows windows, oldest first
    counts, _ = np.histogram(t, bins=edges)
    return max(mean, float(np.percentile(counts / window_s, 90)))
