"""Threshold selection (DiLaServe): for a block, the highest candidate threshold whose predicted
remaining latency fits what is left of the request's SLO budget. Pure functions."""
from __future__ import annotations


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


def choose_threshold(candidates: tuple[float, ...], predicted_s: dict[float, float], budget_s: float | None,
                     cap: float, floor: float) -> float:
    """The highest allowed candidate whose predicted remaining latency fits `budget_s`; the lowest
    allowed when none fits; the highest allowed when the request has no SLO (budget None)."""
    ok = allowed(candidates, cap, floor)
    if budget_s is None:
        return ok[0]
    for c in ok:
        if predicted_s[c] <= budget_s:
            return c
    return ok[-1]
