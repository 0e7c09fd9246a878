"""Capacity search: the highest request rate whose measurement still meets the SLO.

Owns only the search, as pure functions of a ``measure(rate)`` callable and an
``slo_check(result) -> bool`` predicate: start at ``start_rate``; double while the SLO holds
(halve while it fails) until one passing and one failing rate bracket the capacity; then bisect
until ``(upper - lower) / lower <= tolerance`` (2.5 % by default). ``lower`` - the highest rate
seen passing - is reported as the capacity, so the answer errs on the safe side.

``find_capacity`` is a coroutine and accepts a ``measure`` returning a dict or an awaitable of
one; ``find_capacity_sync`` is the same search for plain functions. No I/O here.
"""
from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Generator

Measure = Callable[[float], "dict | Awaitable[dict]"]


def _search(start_rate: float, tolerance: float, max_rate: float | None, min_rate: float,
            max_steps: int) -> Generator[float, bool, tuple[float | None, float | None]]:
    """Yields rates to measure, is sent pass/fail, returns (lower, upper)."""
    if not start_rate > 0 or not tolerance > 0:
        raise ValueError("need start_rate > 0 and tolerance > 0")
    lo = hi = None
    rate, steps = float(start_rate), 0
    while steps < max_steps:                          # phase 1: bracket by doubling/halving
        ok = yield rate
        steps += 1
        if ok:
            lo = rate if lo is None else max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if lo is not None and hi is not None:
            break
        if ok:
            if max_rate is not None and rate >= max_rate:
                return lo, None                       # never failed up to max_rate
            rate = rate * 2 if max_rate is None else min(rate * 2, max_rate)
        else:
            if rate <= min_rate:
                return None, hi                       # fails even at min_rate
            rate = max(rate / 2, min_rate)
    while (lo is not None and hi is not None and hi > lo and (hi - lo) / lo > tolerance
           and steps < max_steps):                    # phase 2: bisect the bracket
        mid = (lo + hi) / 2
        ok = yield mid
        steps += 1
        if ok:
            lo = mid
        else:
            hi = mid
    return lo, hi


def _outcome(lo, hi, history, tolerance) -> dict:
    bracketed = lo is not None and hi is not None
    return {"capacity": lo, "lower": lo, "upper": hi, "bracketed": bracketed,
            "converged": bracketed and (hi - lo) / lo <= tolerance,
            "tolerance": tolerance, "history": history}


class _Driver:
    """Runs `_search` over measured results: `rate` is the next rate to measure (None when done)."""

    def __init__(self, slo_check, start_rate, tolerance, max_rate, min_rate, max_steps):
        self.slo_check, self.tolerance = slo_check, tolerance
        self._gen = _search(start_rate, tolerance, max_rate, min_rate or start_rate / 64, max_steps)
        self.history: list[dict] = []
        self._bounds = (None, None)
        self.rate = self._advance(None)

    def _advance(self, ok):
        try:
            return next(self._gen) if ok is None else self._gen.send(ok)
        except StopIteration as stop:
            self._bounds = stop.value
            return None

    def record(self, result) -> None:
        ok = bool(self.slo_check(result))
        self.history.append({"rate": self.rate, "ok": ok, "result": result})
        self.rate = self._advance(ok)

    def outcome(self) -> dict:
        return _outcome(*self._bounds, self.history, self.tolerance)


def find_capacity_sync(measure: Callable[[float], dict], slo_check: Callable[[Any], bool],
                       start_rate: float = 1.0, tolerance: float = 0.025,
                       max_rate: float | None = None, min_rate: float | None = None,
                       max_steps: int = 40) -> dict:
    """Capacity search for a synchronous ``measure``; see the module docstring."""
    d = _Driver(slo_check, start_rate, tolerance, max_rate, min_rate, max_steps)
    while d.rate is not None:
        result = measure(d.rate)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError("measure returned an awaitable: use `await find_capacity(...)`")
        d.record(result)
    return d.outcome()


async def find_capacity(measure: Measure, slo_check: Callable[[Any], bool],
                        start_rate: float = 1.0, tolerance: float = 0.025,
                        max_rate: float | None = None, min_rate: float | None = None,
                        max_steps: int = 40) -> dict:
    """Capacity search; ``measure(rate)`` may return a dict or an awaitable of one.

    Returns {"capacity", "lower", "upper", "bracketed", "converged", "tolerance", "history"},
    where history lists every {"rate", "ok", "result"} in the order measured.
    """
    d = _Driver(slo_check, start_rate, tolerance, max_rate, min_rate, max_steps)
    while d.rate is not None:
        result = measure(d.rate)
        d.record(await result if inspect.isawaitable(result) else result)
    return d.outcome()
