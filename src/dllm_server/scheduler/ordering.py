"""Deadline-aware ordering: the priority each block carries to its worker, whose waiting prefills and re-prefills
are admitted in priority order (smaller first, ties in arrival order) under the same deficit token budget.
Pure functions of the request's timing; the scheduler applies them, tests/scheduler exercise them exhaustively."""
from __future__ import annotations

FCFS, DEADLINE = "fcfs", "deadline"


def deadline_at(arrived_at: float, slo_s: float | None, default_deadline_s: float) -> float:
    """When the request is due: its SLO after arrival, or `default_deadline_s` for one without an SLO."""
    return arrived_at + (slo_s if slo_s is not None else default_deadline_s)


def is_late(slo_s: float | None, deadline: float, now: float, hopeless: bool) -> bool:
    """A request that will miss its SLO: the policy found no allowed threshold that meets it (`hopeless`), or it
    is already due. One without an SLO is never late: among those, arrival order stands."""
    return slo_s is not None and (hopeless or now > deadline)


def block_priority(order: str, arrived_at: float, slo_s: float | None, default_deadline_s: float,
                   late: bool) -> float:
    """The block's place in line. FCFS: 0 for every block (arrival order decides). Deadline: the request's
    deadline; a late request yields to every request that can still make it by `default_deadline_s`, so it waits
    behind them but never unboundedly: a request that arrives after t is placed after t, so whatever arrives
    after this priority's time goes behind it."""
    if order == FCFS:
        return 0.0
    deadline = deadline_at(arrived_at, slo_s, default_deadline_s)
    return deadline + default_deadline_s if late else deadline
