"""Cluster-wide load control (DiLaServe): a cap on every request's threshold. Per candidate cap, the forward rate the
load needs against what the workers can run within the SLO at that cap; the cap drops until demand fits, never below
the quality floor, and rises again with hysteresis, so a steady load settles on one cap."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def demand_rate(work: np.ndarray, budgets_s: np.ndarray, min_horizon_s: float) -> np.ndarray:
    """[C] forwards per second all requests need per cap: work [R, C] remaining forwards over budgets_s [R]."""
    if work.size == 0:
        return np.zeros(work.shape[1] if work.ndim == 2 else 0)
    return (work / np.maximum(budgets_s, min_horizon_s)[:, None]).sum(axis=0)


def arrival_rate(times, now: float, windows: tuple[float, ...] = (1.0, 5.0)) -> float:
    """Admissions per second from ascending `times`: the largest mean over the trailing `windows`, so a burst
    counts at once and a lull only after the longest. A window is cut at the first admission, never below 1 s."""
    if not times:
        return 0.0
    longest = max(windows)
    ages = []
    for t in reversed(times):
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
    calm_updates: int = 1                  # ... and only after that many updates in a row below it
    cap_index: int = 0
    calm: int = 0

    @property
    def cap(self) -> float:
        return self.candidates[self.cap_index]

    def update(self, demand: np.ndarray, capacity) -> float:
        """Forwards/s needed and available per candidate cap. Lowers at once to the highest cap that fits (else
        the floor); raises one step at a time, only with room to spare."""
        cap = np.broadcast_to(np.asarray(capacity, dtype=float), (len(self.candidates),))
        if len(demand) != len(self.candidates) or not (cap > 0).all():
            return self.cap
        limit = self.target * cap
        i = self.cap_index
        if demand[i] > limit[i]:
            fits = [j for j in range(i, len(self.candidates)) if demand[j] <= limit[j]]
            self.cap_index = fits[0] if fits else len(self.candidates) - 1
            self.calm = 0
        elif i > 0 and demand[i - 1] <= (self.target - self.hysteresis) * cap[i - 1]:
            self.calm += 1
            if self.calm >= self.calm_updates:
                self.cap_index, self.calm = i - 1, 0
        else:
            self.calm = 0
        return self.cap
