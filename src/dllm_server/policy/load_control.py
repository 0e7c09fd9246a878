"""Cluster-wide load control (DiLaServe): a cap on every request's threshold. The worst-case load
is every active and waiting request decoding the rest of its answer at the highest threshold it
is allowed; if the forward rate that needs (work over each request's remaining budget) exceeds
what the workers can run, the cap comes down until it fits, never below the quality floor, and
goes back up when load falls. Pure demand/capacity functions plus a small controller state
with hysteresis, so a steady load settles on one cap."""
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


def capacity_rate(iteration_s: Callable[[int], float], max_batch: int) -> float:
    """Request-forwards per second one worker can run: a batch of n advances n requests by one
    forward per iteration, so the best n / t(n) over the batch sizes it may seat."""
    sizes = sorted({1 << i for i in range(max(1, max_batch).bit_length()) if 1 << i <= max_batch} | {max_batch})
    best = 0.0
    for n in sizes:
        t = iteration_s(n)
        if t > 0:
            best = max(best, n / t)
    return best


@dataclass(slots=True)
class LoadController:
    candidates: tuple[float, ...]          # highest first, all >= the quality floor
    target: float = 0.9                    # use at most this share of capacity
    hysteresis: float = 0.15               # raise only below (target - hysteresis)
    cap_index: int = 0

    @property
    def cap(self) -> float:
        return self.candidates[self.cap_index]

    def update(self, demand: np.ndarray, capacity: float) -> float:
        """demand[i]: the forward rate needed if the cap were candidates[i]. Lower at once to the
        highest cap that fits (the floor when none does); raise one step at a time, only with room."""
        if capacity <= 0 or len(demand) != len(self.candidates):
            return self.cap
        limit = self.target * capacity
        if demand[self.cap_index] > limit:
            fits = [i for i in range(self.cap_index, len(self.candidates)) if demand[i] <= limit]
            self.cap_index = fits[0] if fits else len(self.candidates) - 1
        elif self.cap_index > 0 and demand[self.cap_index - 1] <= (self.target - self.hysteresis) * capacity:
            self.cap_index -= 1
        return self.cap
