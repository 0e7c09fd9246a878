"""The planner's model of a layout: the SLO attainment, mean threshold and tail latency it predicts for a sample of
recent requests (each its own SLO class: budget and forwards per threshold) arriving in bursts. Formulation:
docs/reconfiguration.md "The attainment planner"."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .capacity_table import IterationTime, iteration_at

WINDOW_S = 5.0          # the forecast's burstiness: arrival rates over windows of this length
RHO_MAX = 0.95         # a window over capacity queues as a backlog (predict), not as a steady-state queue


@dataclass(frozen=True)
class Demand:
    """A sample of requests (budgets_s, blocks and canvas tokens [R], forwards [R, C] at each of `thresholds`) and
    the rates of recent windows (req/s, in order), the bursts the forecast repeats."""
    budgets_s: np.ndarray
    forwards: np.ndarray
    blocks: np.ndarray
    canvases: np.ndarray
    thresholds: tuple[float, ...]
    window_rates: np.ndarray
    arrival_cv2: float = 1.0     # squared CV of the gaps between arrivals within a window

    def scaled(self, rate: float) -> "Demand":
        """The same bursts at mean `rate`."""
        mean = float(np.mean(self.window_rates)) if len(self.window_rates) else 0.0
        rates = self.window_rates * (rate / mean) if mean > 0 else np.full(max(1, len(self.window_rates)), rate)
        return dataclasses.replace(self, window_rates=rates)


@dataclass(frozen=True)
class Prediction:
    attainment: float        # share of requests predicted to meet their SLO
    mean_threshold: float
    tail_s: float            # p90 of predicted latencies
    capacity: float          # req/s the layout serves at the floor


def window_rates(arrival_times_s: Sequence[float], now_s: float, span_s: float, window_s: float = WINDOW_S):
    """Req/s in consecutive `window_s` windows over the last `span_s` (one window if the span is shorter)."""
    t = np.asarray(arrival_times_s, dtype=float)
    n = max(1, int(span_s // window_s))
    edges = now_s - window_s * np.arange(n, -1, -1)
    counts, _ = np.histogram(t, bins=edges)
    return counts / window_s


class InstanceModel:
    """One instance of degree d: iteration time against batch, and what the SLO policy would choose at it."""

    def __init__(self, iteration_s: IterationTime, degree: int, seats: int, demand: Demand, floor_index: int, *,
                 token_budget: int | None, credit_share: float, row_tokens: int):
        self.demand, self.floor_index = demand, floor_index
        mean_f = self.mean_f = demand.forwards.mean(axis=0)
        c = int(demand.canvases.mean())
        blocks = float(demand.blocks.mean())
        self.t = np.zeros((len(demand.thresholds), seats + 2))    # t[j, n]: iteration seconds, all at threshold j
        self.seats = np.ones(len(demand.thresholds))              # the batch the token budget keeps fed (fractional)
        for j, fj in enumerate(mean_f):
            per_seat = blocks * c / max(fj, 1.0)                  # recompute tokens per iteration per seated request
            self.seats[j] = min(float(seats), max(1.0, _fed_batch(per_seat, token_budget, credit_share, row_tokens)))
            for n in range(1, seats + 2):
                self.t[j, n] = iteration_at(iteration_s, degree, n, n * per_seat / c, c)
        self.alone = _alone_s(iteration_s, degree, demand)       # [R, C] each request's latency by itself
        # the floor's throughput: what routing splits the load by
        fed = self.seats[floor_index]
        self.capacity = fed / (mean_f[floor_index] * self.time(floor_index, fed))

    def time(self, j: int, n: float) -> float:
        """t_j(n) for a fractional batch."""
        return float(np.interp(n, np.arange(1, self.t.shape[1]), self.t[j, 1:]))

    def at_load(self, rate: float, wait_s: float, cap_index: int, pooled: int = 1):
        """(latency_s [R], chosen threshold index [R], served share, req/s served at most) at `rate` req/s with
        requests waiting `wait_s` first, each at the highest threshold from the cap's down to the floor's that meets
        its budget (else the floor); the batch from Little's law, n = rate F t(n)."""
        f, b, alone = self.demand.forwards, self.demand.budgets_s, self.alone
        rows = np.arange(len(b))
        cols = np.arange(cap_index, self.floor_index + 1)
        n, j = 1.0, self.floor_index
        def choose(j: int, n: float):
            slow = self.time(j, n) / self.t[j, 1]
            fits = alone[:, cols] * slow + wait_s <= b[:, None]
            return cols[np.where(fits.any(axis=1), np.argmax(fits, axis=1), len(cols) - 1)], slow
        for _ in range(40):
            chosen, slow = choose(j, n)
            fbar = float(f[rows, chosen].mean())
            j = int(np.argmin(np.abs(self.mean_f - fbar)))           # the iteration time of this mix's recomputes
            new = min(float(self.seats[j]), max(1.0, rate * fbar * self.time(j, n)))
            if abs(new - n) < 1e-3 * n:
                break
            n = 0.5 * (n + new)
        chosen, slow = choose(j, n)             # the damped batch may sit between two mixes: choose at where it ends
        t = self.time(j, n)
        top = float(self.seats[j])
        service = alone[rows, chosen] * slow
        served_max = top / float(service.mean() * self.time(j, top) / t)
        rho = min(rate / served_max, RHO_MAX) if served_max > 0 else RHO_MAX
        # G/G/c queueing for a seat (Sakasegawa): P(wait) and the mean wait of those who wait
        # routing to the least loaded pools the `pooled` instances of this degree into one queue
        seats = top * pooled
        p_wait = rho ** (np.sqrt(2.0 * (seats + 1)) - 1.0)
        cs2 = float(service.var() / max(service.mean() ** 2, 1e-12))
        variability = (self.demand.arrival_cv2 + cs2) / 2.0
        mean_wait = (service.mean() / seats) * p_wait / (1.0 - rho) * variability
        # a queue near saturation takes this long to reach its steady state; a window is shorter (the backlog
        # between windows is predict's): the share of the steady state's waiting a window builds
        relax_s = (service.mean() / seats) * variability / (1.0 - np.sqrt(rho)) ** 2
        built = 1.0 - np.exp(-WINDOW_S / max(relax_s, 1e-12))
        return service + wait_s, chosen, min(1.0, served_max / rate) if rate > 0 else 1.0, served_max, \
            (p_wait * built, mean_wait / max(p_wait, 1e-12))


def _alone_s(iteration_s: IterationTime, degree: int, demand: Demand, bucket: int = 64) -> np.ndarray:
    """[R, C]: per block a full-canvas recompute, the block's other forwards as single-row decodes over the canvas
    (canvases rounded up to `bucket` tokens, so a step-time model is asked once per size)."""
    sizes = np.maximum(bucket, -(-demand.canvases.astype(int) // bucket) * bucket)
    pre, dec = {}, {}
    for size in np.unique(sizes).tolist():
        pre[size] = iteration_s(degree, 0, 0, size, size * size)
        dec[size] = iteration_s(degree, 1, size, 0, 0)
    p = np.array([pre[s] for s in sizes.tolist()])[:, None]
    d = np.array([dec[s] for s in sizes.tolist()])[:, None]
    b = demand.blocks[:, None]
    return b * p + np.maximum(demand.forwards - b, 0.0) * d


def _fed_batch(per_seat: float, token_budget: int | None, credit_share: float, row_tokens: int) -> float:
    """The largest batch n whose recomputes, n x per_seat tokens an iteration, fit the budget's allowance
    (capacity_table.recompute_allowance: the budget less the decode rows, at least its credit share)."""
    if token_budget is None:
        return float("inf")
    n = token_budget / (per_seat + row_tokens)
    if token_budget - n * row_tokens < token_budget * credit_share:
        n = token_budget * credit_share / per_seat
    return n


def predict(layout: Mapping[int, int], models: Mapping[int, InstanceModel], demand: Demand,
            target: float = 0.9) -> Prediction:
    """The layout's attainment over the demand's windows: load split by each instance's capacity, a backlog carried
    from an overloaded window to the next (its wait added to every request there, so what a window cannot serve
    is counted where it is served), the policy's cap the highest threshold whose load stays within `target` of
    what the instance serves (load control)."""
    counts = {d: n for d, n in layout.items() if n}
    if not counts:
        return Prediction(0.0, 0.0, float("inf"), 0.0)
    total_cap = sum(n * models[d].capacity for d, n in counts.items())
    taus = np.asarray(demand.thresholds)
    b = demand.budgets_s
    met_sum = tau_sum = weight = 0.0
    lats, lat_w = [], []
    backlog = dict.fromkeys(counts, 0.0)
    for rate in demand.window_rates:
        for d, n in counts.items():
            m = models[d]
            share = rate * m.capacity / total_cap                # one instance's req/s
            # behind the backlog carried in, and half of what this window adds to it (the fluid queue's mean)
            wait = (backlog[d] + max(0.0, share - m.capacity) * WINDOW_S / 2) / max(m.capacity, 1e-12)
            for cap in range(m.floor_index + 1):
                latency, chosen, served, served_max, (p_wait, wait_mean) = m.at_load(share, wait, cap, n)
                if served_max * target >= share:
                    break                                        # load control: the highest cap within target
            w = n * share * WINDOW_S
            slack = b - latency              # a request waiting W for a seat meets its SLO iff W <= slack
            met = np.where(slack < 0, 0.0, 1.0 - p_wait * np.exp(-np.maximum(slack, 0) / max(wait_mean, 1e-12)))
            met_sum += w * float(met.mean())          # what a window leaves unserved waits in the next
            tau_sum += w * float(taus[chosen].mean())
            weight += w
            backlog[d] = max(0.0, backlog[d] + (share - served_max) * WINDOW_S)
            lats.append(latency + p_wait * wait_mean)
            lat_w.append(np.full(len(latency), w))
    if weight <= 0:
        return Prediction(1.0, float(taus[0]), 0.0, total_cap)
    lat, wts = np.concatenate(lats), np.concatenate(lat_w)
    order = np.argsort(lat)
    cum = np.cumsum(wts[order])
    tail = float(lat[order][np.searchsorted(cum, 0.9 * cum[-1])])
    return Prediction(met_sum / weight, tau_sum / weight, tail, total_cap)


def layouts(num_devices: int, degrees: Sequence[int]) -> list[dict[int, int]]:
    """Every {degree: instances} using all `num_devices` (the planner's candidates)."""
    out: list[dict[int, int]] = []

    def go(k: int, left: int, acc: dict[int, int]) -> None:
        if k == len(degrees):
            if left == 0:
                out.append({d: n for d, n in acc.items() if n})
            return
        d = degrees[k]
        for n in range(left // d + 1):
            go(k + 1, left - n * d, {**acc, d: n})
    go(0, num_devices, {})
    return out
