"""Stage 1 of DiLaServe's cluster planner (a MILP, docs/reconfiguration.md "Stage 1"): instances per TP degree
for the forecast rate, the running layout's value, the hysteresis and the forecast."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from .attainment import window_rates


UNSERVED_PENALTY = 1e3      # M: a req/s unserved weighs more than any threshold gain
SPARE_WEIGHT = 1e-4         # eps: the tie-break's largest possible weight, in mean-threshold units
OBJECTIVE_SCALE = 1e4       # HiGHS stops at an absolute gap of 1e-6, which would blur the ~1e-7 tie-break


@dataclass(frozen=True)
class CapacityPlan:
    """Stage 1's answer: `instances` n[d, tau], `rates` x[d, tau] (all rates req/s), `why` when infeasible."""
    counts: dict[int, int]
    instances: dict[tuple[int, float], int]
    rates: dict[tuple[int, float], float]
    rate: float
    mean_threshold: float
    unserved_rate: float
    spare_rate: float
    devices_used: int
    feasible: bool
    why: str = ""
    objective: float = field(default=0.0, repr=False)

    @property
    def served_rate(self) -> float:
        return self.rate - self.unserved_rate


def describe_counts(counts: Mapping[int, int]) -> str:
    return " + ".join(f"{n} x TP{d}" for d, n in sorted(counts.items()) if n) or "no instance"


def plan_capacity(capacity: Mapping[tuple[int, float], float], degrees: Sequence[int], thresholds: Sequence[float],
                  num_devices: int, rate: float, utilisation: float = 0.7, *,
                  unserved_penalty: float = UNSERVED_PENALTY, spare_weight: float = SPARE_WEIGHT) -> CapacityPlan:
    """Instances per degree and threshold maximising the mean threshold; on overload the plan serving the most."""
    return _solve(capacity, list(degrees), list(thresholds), rate, utilisation, num_devices, None,
                  unserved_penalty, spare_weight)


def evaluate_layout(capacity: Mapping[tuple[int, float], float], counts_by_degree: Mapping[int, int],
                    thresholds: Sequence[float], rate: float, utilisation: float = 0.7,
                    num_devices: int | None = None, *, unserved_penalty: float = UNSERVED_PENALTY,
                    spare_weight: float = SPARE_WEIGHT) -> CapacityPlan:
    """Stage 1's value of a given layout (instance counts fixed). Pass the cluster's `num_devices` so the
    tie-break scales as plan_capacity's and a plan's own counts evaluate to its value exactly."""
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
    # variables [n (k), x (k), u]; milp minimises, so the objective's negative
    c = OBJECTIVE_SCALE * np.concatenate([-spare_weight * cap / norm, -tau / lam + spare_weight / norm,
                                          [unserved_penalty / lam]])
    if fixed is None:
        n_hi = np.where(cap > 0, np.floor(num_devices / deg), 0.0)
    else:
        n_hi = np.array([float(fixed[d]) for d, _ in pairs])
    lo = np.zeros(2 * k + 1)
    hi = np.concatenate([n_hi, np.full(k, np.inf), [np.inf]])
    rows = [np.concatenate([np.zeros(k), np.ones(k), [1.0]])]
    row_lo, row_hi = [rate], [rate]
    if fixed is None:
        rows.append(np.concatenate([deg, np.zeros(k + 1)]))
        row_lo.append(0.0)
        row_hi.append(float(num_devices))
    else:
        for d in degrees:
            rows.append(np.concatenate([[1.0 if e == d else 0.0 for e, _ in pairs], np.zeros(k + 1)]))
            row_lo.append(float(fixed[d]))
            row_hi.append(float(fixed[d]))
    link = np.hstack([-np.diag(cap), np.eye(k), np.zeros((k, 1))])
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
    """Hysteresis: regroup at once on overload if the target serves more, else only for a mean-threshold gain of
    `min_gain`, serving no less, a period after the last change (a regroup drains and restarts instances)."""
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
    """Req/s to plan the next period for: max(the last period's mean, p90 of its `window_s` windows' rates)."""
    if period_s <= 0:
        raise ValueError(f"period_s must be > 0, got {period_s}")
    t = np.asarray(arrival_times_s, dtype=float)
    t = t[(t > now_s - period_s) & (t <= now_s)]
    mean = len(t) / period_s
    num_windows = int(period_s // window_s) if window_s > 0 else 0
    if num_windows < 2:
        return mean
    return max(mean, float(np.percentile(window_rates(t, now_s, period_s, window_s), 90)))
