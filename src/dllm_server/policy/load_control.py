"""Cluster-wide load control (DiLaServe): a cap on every request's threshold. For each candidate
cap, the forward rate the load needs (the arrival rate times a new request's predicted forwards
at that cap, or the in-flight requests' remaining forwards over their remaining budgets, the
larger) against the rate the workers can run *within the SLO* at that cap (a batch may only
grow while an iteration stays short enough for a request's forwards to fit its budget). When
demand exceeds capacity the cap comes down until it fits, never below the quality floor, and
goes back up when load falls. Pure demand/capacity functions plus a small controller state with
hysteresis, so a steady load settles on one cap."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


def demand_rate(work: np.ndarray, budgets_s: np.ndarray, min_horizon_s: float) -> np.ndarray:
    """work [R, C]: each request's predicted remaining forwards if it decoded at candidate c;
    budgets_s [R]: its remaining SLO budget (or a default horizon). Returns [C]: the forwards per
    second all of them need, per cap."""
    if work.size == 0:
        return np.zeros(work.shape[1] if work.ndim == 2 else 0)
    return (work / np.maximum(budgets_s, min_horizon_s)[:, None]).sum(axis=0)


def arrival_rate(times, now: float, windows: tuple[float, ...] = (1.0, 5.0)) -> float:
    """Admissions per second from `times` (ascending): the largest mean over the trailing
    `windows`, so a burst counts within the shortest window and a lull lowers the rate only once
    the longest has passed. A window reaching back before the first admission is cut there, but
    never below 1 s (one admission is not an infinite rate)."""
    if not times:
        return 0.0
    longest = max(windows)
    ages = []
    for t in reversed(times):          # newest first; stop past the longest window
        if t < now - longest:
            break
        ages.append(now - t)
    ages = np.asarray(ages)
    return max(float((ages <= w).sum()) / max(min(w, now - times[0]), 1.0) for w in windows)


@dataclass(slots=True)
class LoadController:
    candidates: tuple[float, ...]          # highest first, all >= the quality floor
    target: float = 0.9                    # use at most this share of capacity
    hysteresis: float = 0.15               # raise only below (target - hysteresis)
    cap_index: int = 0

    @property
    def cap(self) -> float:
        return self.candidates[self.cap_index]

    def update(self, demand: np.ndarray, capacity) -> float:
        """demand[i] / capacity[i] (or one capacity for all): the forward rate needed and available
        if the cap were candidates[i]. Lower at once to the highest cap that fits (the floor when
        none does); raise one step at a time, only with room to spare."""
        cap = np.broadcast_to(np.asarray(capacity, dtype=float), (len(self.candidates),))
        if len(demand) != len(self.candidates) or not (cap > 0).all():
            return self.cap
        limit = self.target * cap
        i = self.cap_index
        if demand[i] > limit[i]:
            fits = [j for j in range(i, len(self.candidates)) if demand[j] <= limit[j]]
            self.cap_index = fits[0] if fits else len(self.candidates) - 1
        elif i > 0 and demand[i - 1] <= (self.target - self.hysteresis) * cap[i - 1]:
            self.cap_index = i - 1
        return self.cap
