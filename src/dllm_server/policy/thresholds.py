"""Threshold selection (DiLaServe): for a block, the highest candidate threshold whose predicted
remaining latency fits what is left of the request's SLO budget. Pure functions (one request, or
a batch of them at once)."""
from __future__ import annotations

import functools

import numpy as np


def remaining_seconds(block_rem: float, fut_forwards: float, fut_blocks: float, iteration_s: float,
                      reprefill_wait_s: float) -> float:
    """Every remaining forward costs one iteration of the worker at its current load; every later
    block also waits for its re-prefill to be admitted under the token budget."""
    return (block_rem + fut_forwards) * iteration_s + fut_blocks * reprefill_wait_s


def allowed(candidates: tuple[float, ...], cap: float, floor: float) -> tuple[float, ...]:
    """Candidates (highest first) between the quality floor and the load-control cap; never empty:
    the floor's nearest candidate survives any cap."""
    ok = tuple(c for c in candidates if floor <= c <= cap)
    if ok:
        return ok
    above = [c for c in candidates if c >= floor]
    return (min(above),) if above else (max(candidates),)


@functools.lru_cache(maxsize=256)
def _allowed_mask(candidates: tuple[float, ...], cap: float, floor: float) -> np.ndarray:
    ok = allowed(candidates, cap, floor)
    return np.asarray([c in ok for c in candidates])


def choose_indices(candidates: tuple[float, ...], seconds: np.ndarray, budgets_s: np.ndarray, cap: float,
                   floor: float, default: float | None = None, slack: float = 0.0,
                   alone: np.ndarray | None = None) -> np.ndarray:
    """For a batch: seconds [R, C] (predicted remaining latency of request r at candidates[c],
    highest first), budgets_s [R] (inf: no SLO). Per request, the index of the highest allowed
    candidate that fits its budget, else of the lowest allowed. A candidate above `default` (the
    server's own threshold) must fit with `slack` of the budget to spare, and is never used while
    load control caps the thresholds (cap below the top candidate), nor for a request that shares
    its worker (`alone` [R] False: other requests in flight there or admitted in the same call): a
    threshold above what the server would run anyway is a luxury of an idle worker, not something
    to take into a burst, where the queueing estimate errs most (a CI run: 3 of 6 raised requests
    of a 24-request burst missed an SLO they were predicted to meet with 30 % to spare)."""
    ok = _allowed_mask(candidates, cap, floor)
    budgets = np.asarray(budgets_s, dtype=float)[:, None]
    fits = ok & (seconds <= budgets)
    if default is not None:
        above = np.asarray([c > default for c in candidates])
        capping = cap < candidates[0]
        luxury = (seconds <= (1.0 - slack) * budgets) & (not capping)
        if alone is not None:
            luxury &= np.asarray(alone, dtype=bool)[:, None]
        fits &= ~above | luxury
    lowest_ok = len(candidates) - 1 - int(np.argmax(ok[::-1]))
    return np.where(fits.any(axis=1), np.argmax(fits, axis=1), lowest_ok)


def choose_threshold(candidates: tuple[float, ...], predicted_s: dict[float, float], budget_s: float | None,
                     cap: float, floor: float) -> float:
    """One request: the highest allowed candidate whose predicted remaining latency fits
    `budget_s`; the lowest allowed when none fits; the highest allowed without an SLO (None)."""
    secs = np.asarray([[predicted_s[c] for c in candidates]])
    budget = np.inf if budget_s is None else budget_s
    return candidates[int(choose_indices(candidates, secs, np.asarray([budget]), cap, floor)[0])]
