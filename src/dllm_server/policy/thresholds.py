"""Threshold selection (DiLaServe): the highest candidate whose predicted remaining latency fits the SLO budget."""
from __future__ import annotations

import functools

import numpy as np


def remaining_seconds(block_rem: float, fut_forwards: float, fut_blocks: float, iteration_s: float,
                      reprefill_wait_s: float) -> float:
    """Seconds left: each forward one iteration at the current load; each later block also waits for its re-prefill."""
    return (block_rem + fut_forwards) * iteration_s + fut_blocks * reprefill_wait_s


def forwards_per_block(candidates: tuple[float, ...], observed: dict[float, float]) -> np.ndarray | None:
    """[C] forwards a block takes at each candidate: as blocks ran at it (`observed`), interpolated in the
    threshold between observed ones and held flat past them, never fewer at a higher threshold; None before any."""
    if not observed:
        return None
    xs = sorted(observed)
    out = np.interp(np.asarray(candidates, dtype=float), xs, [observed[x] for x in xs])
    order = np.argsort(candidates)
    out[order] = np.maximum.accumulate(out[order])
    return out


def price_blocks(per_block: np.ndarray, fut_blocks: np.ndarray, current: np.ndarray, masked_frac: np.ndarray,
                 last_frac: np.ndarray, running: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([R, C] forwards of the later blocks, [R, C] of the block under way): each block at per_block [C], the forwards
    blocks took at each candidate, a short one (the last; a block-causal first) in proportion to its positions
    (`last_frac` [R]: positions / block length), never under one forward. The block under way in proportion to its
    positions still masked (`masked_frac` [R]), started or not: at each candidate where the decision is for it
    (`current` [R]), else (a lease for the next block) at `running` [R], the forwards blocks took at the threshold
    it runs at. The estimator alone priced a first block's rest at the positions that clear the threshold now, one
    a forward early on, and flagged requests whose SLO fitted as hopeless."""
    last = np.maximum(1.0, last_frac[:, None] * per_block)
    fut = np.where(fut_blocks >= 1, (fut_blocks - 1) * per_block + last, 0.0)
    forwards = np.where(current[:, None], per_block[None, :], running[:, None])
    return fut, np.where(masked_frac[:, None] > 0, np.maximum(1.0, masked_frac[:, None] * forwards), 0.0)


def allowed(candidates: tuple[float, ...], cap: float, floor: float) -> tuple[float, ...]:
    """Candidates (highest first) between the quality floor and the cap; never empty: the floor's nearest survives."""
    ok = tuple(c for c in candidates if floor <= c <= cap)
    if ok:
        return ok
    above = [c for c in candidates if c >= floor]
    return (min(above),) if above else (max(candidates),)


@functools.lru_cache(maxsize=256)
def allowed_mask(candidates: tuple[float, ...], cap: float, floor: float) -> np.ndarray:
    ok = allowed(candidates, cap, floor)
    return np.asarray([c in ok for c in candidates])


def lowest_allowed(candidates: tuple[float, ...], cap: float, floor: float) -> int:
    """Index of the lowest allowed candidate (candidates highest first)."""
    return len(candidates) - 1 - int(np.argmax(allowed_mask(candidates, cap, floor)[::-1]))


def choose_indices(candidates: tuple[float, ...], seconds: np.ndarray, budgets_s: np.ndarray, cap: float,
                   floor: float, default: float | None = None, slack: float = 0.0,
                   alone: np.ndarray | None = None, spares: np.ndarray | None = None) -> np.ndarray:
    """Per request, the index of the highest allowed candidate whose seconds [R, C] fit budgets_s [R] (inf: no SLO),
    else of the lowest allowed. One above `default` must fit with `slack` of the budget to spare, never while load
    control caps, and only for a request `alone` [R] on its worker: the queueing estimate errs most in a burst. `spares`
    [R, C]: whether the others on its worker can afford a candidate's forwards; the floor and below always pass."""
    ok = allowed_mask(candidates, cap, floor)
    budgets = np.asarray(budgets_s, dtype=float)[:, None]
    fits = ok & (seconds <= budgets)
    if default is not None:
        above = np.asarray([c > default for c in candidates])
        capping = cap < candidates[0]
        luxury = (seconds <= (1.0 - slack) * budgets) & (not capping)
        if alone is not None:
            luxury &= np.asarray(alone, dtype=bool)[:, None]
        fits &= ~above | luxury
    if spares is not None:
        fits &= spares | (np.asarray(candidates) <= floor)[None, :]
    return np.where(fits.any(axis=1), np.argmax(fits, axis=1), lowest_allowed(candidates, cap, floor))


def choose_threshold(candidates: tuple[float, ...], predicted_s: dict[float, float], budget_s: float | None,
                     cap: float, floor: float) -> float:
    """One request, as choose_indices without the default rule; the highest allowed without an SLO (None)."""
    secs = np.asarray([[predicted_s[c] for c in candidates]])
    budget = np.inf if budget_s is None else budget_s
    return candidates[int(choose_indices(candidates, secs, np.asarray([budget]), cap, floor)[0])]
