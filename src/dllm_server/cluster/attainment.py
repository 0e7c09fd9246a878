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
SLOWDOWN_POINTS = 16   # quantiles of the slowdown distribution a prediction integrates over


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
        return float(self._times(j, n))

    def _times(self, j: int, n):
        return np.interp(n, np.arange(1, self.t.shape[1]), self.t[j, 1:])

    def slowdowns(self, j: int, rate: float, fbar: float, pooled: int) -> np.ndarray:
        """SLOWDOWN_POINTS equally likely slowdowns t_j(n) / t_j(1) a request meets, n its instance's mean occupancy
        while it runs: `pooled` instances fed by least-loaded routing as one birth-death queue (N requests in them,
        each instance serving n / (fbar t_j(n)) requests a second), an arrival sees N (PASTA). A batch's iteration
        grows with its rows, so a mean batch (Little's law) would price a request alone whenever the mean is under
        one, and miss the bursts of company."""
        c, top = max(1, pooled), float(self.seats[j])
        cap = int(np.ceil(top)) * c                                       # past this every seat is fed
        # others on its instance: floor(N / c) where it arrives (the least loaded), N / c once later arrivals have
        # filled every instance evenly; its life spans both, so the mean of the two
        occupancy = np.minimum((np.arange(cap + 1) // c + np.arange(cap + 1) / c) / 2, top)
        per_instance = np.minimum(np.arange(int(np.ceil(top)) + 2), top)
        served = per_instance / self._times(j, np.maximum(per_instance, 1.0))                 # forwards/s
        q, r = np.divmod(np.arange(cap + 1), c)                            # N split evenly over the instances
        total = (c - r) * served[np.minimum(q, len(served) - 1)] + r * served[np.minimum(q + 1, len(served) - 1)]
        lam = min(rate * c * fbar, RHO_MAX * total[-1])                     # an overload is predict's backlog
        if lam <= 0:
            return np.ones(SLOWDOWN_POINTS)
        log_p = np.concatenate(([0.0], np.cumsum(np.log(lam) - np.log(total[1:]))))
        p = np.exp(log_p - log_p.max())
        p[-1] /= 1.0 - lam / total[-1]                                     # the geometric tail: every seat fed
        p /= p.sum()
        slow = self._times(j, 1.0 + np.minimum(occupancy, top - 1.0)) / self.t[j, 1]
        u = (np.arange(SLOWDOWN_POINTS) + 0.5) / SLOWDOWN_POINTS
        return slow[np.minimum(np.searchsorted(np.cumsum(p), u), cap)]

    def at_load(self, rate: float, wait_s: float, cap_index: int, pooled: int = 1) -> "Load":
        """What `rate` req/s on each of `pooled` instances meets, requests waiting `wait_s` first: each at the highest
        threshold from the cap's down to the floor's that meets its budget at the mean slowdown (else the floor)."""
        f, b, alone = self.demand.forwards, self.demand.budgets_s, self.alone
        rows = np.arange(len(b))
        cols = np.arange(cap_index, self.floor_index + 1)

        def choose(slow: float) -> np.ndarray:
            fits = alone[:, cols] * slow + wait_s <= b[:, None]
            return cols[np.where(fits.any(axis=1), np.argmax(fits, axis=1), len(cols) - 1)]
        slows = np.ones(SLOWDOWN_POINTS)
        chosen = choose(1.0)
        for _ in range(20):
            fbar = float(f[rows, chosen].mean())
            j = int(np.argmin(np.abs(self.mean_f - fbar)))           # the iteration time of this mix's recomputes
            slows = self.slowdowns(j, rate, fbar, pooled)
            again = choose(float(slows.mean()))
            if np.array_equal(again, chosen):
                break
            chosen = again
        top = float(self.seats[j])
        run_alone = alone[rows, chosen]
        service = run_alone * float(slows.mean())
        served_max = top / float(run_alone.mean() * self.time(j, top) / self.t[j, 1])
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
        return Load(latency=service + wait_s, chosen=chosen, served=min(1.0, served_max / rate) if rate > 0 else 1.0,
                    served_max=served_max, p_wait=float(p_wait * built),
                    wait_mean=float(mean_wait / max(p_wait, 1e-12)), slowdowns=slows)

    def met(self, load: "Load", wait_s: float) -> np.ndarray:
        """Each request's chance to meet its budget over the slowdowns it may meet and a wait for a seat: the policy
        chooses each block's threshold as it runs, so a request slowed more than its threshold allowed for falls
        back as far as the floor; it misses only where the floor does not fit."""
        floor = self.alone[:, self.floor_index]
        slack = self.demand.budgets_s[:, None] - (floor[:, None] * load.slowdowns[None, :] + wait_s)
        ok = 1.0 - load.p_wait * np.exp(-np.maximum(slack, 0.0) / max(load.wait_mean, 1e-12))
        return np.where(slack < 0, 0.0, ok).mean(axis=1)


@dataclass(frozen=True)
class Load:
    """InstanceModel.at_load's answer; per request [R] where an array."""
    latency: np.ndarray      # at the mean slowdown, after the wait given
    chosen: np.ndarray       # threshold index
    served: float            # share of the rate served
    served_max: float        # req/s at most
    p_wait: float            # P(a request waits for a seat) within a window
    wait_mean: float         # the mean wait of those who wait
    slowdowns: np.ndarray    # SLOWDOWN_POINTS equally likely slowdowns


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
            target: float = 0.9, backlog: float = 0.0) -> Prediction:
    """The layout's attainment over the demand's windows: load split by each instance's capacity, a backlog carried
    from an overloaded window to the next (its wait added to every request there, so what a window cannot serve
    is counted where it is served), the policy's cap the highest threshold whose load stays within `target` of
    what the instance serves (load control). `backlog`: requests already waiting at the start, split likewise."""
    counts = {d: n for d, n in layout.items() if n}
    if not counts:
        return Prediction(0.0, 0.0, float("inf"), 0.0)
    total_cap = sum(n * models[d].capacity for d, n in counts.items())
    taus = np.asarray(demand.thresholds)
    met_sum = tau_sum = weight = 0.0
    lats, lat_w = [], []
    waiting = {d: backlog * models[d].capacity / total_cap for d in counts}     # per instance
    for rate in demand.window_rates:
        for d, n in counts.items():
            m = models[d]
            share = rate * m.capacity / total_cap                # one instance's req/s
            # behind the backlog carried in, and half of what this window adds to it (the fluid queue's mean)
            wait = (waiting[d] + max(0.0, share - m.capacity) * WINDOW_S / 2) / max(m.capacity, 1e-12)
            for cap in range(m.floor_index + 1):
                load = m.at_load(share, wait, cap, n)
                if load.served_max * target >= share:
                    break                                        # load control: the highest cap within target
            w = n * share * WINDOW_S
            met_sum += w * float(m.met(load, wait).mean())      # what a window leaves unserved waits in the next
            tau_sum += w * float(taus[load.chosen].mean())
            weight += w
            waiting[d] = max(0.0, waiting[d] + (share - load.served_max) * WINDOW_S)
            lats.append(load.latency + load.p_wait * load.wait_mean)
            lat_w.append(np.full(len(load.latency), w))
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
