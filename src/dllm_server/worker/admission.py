"""Deficit token-budget admission (rules: docs/architecture.md): pure functions, no state, no I/O, no torch.
Behind a head stalled on memory, blocks already holding their pages may still pass: pages return only when
holders finish, so making them wait would deadlock. Unused credit resets when the queue empties (deficit round
robin), else a burst after a light turn would come in as one oversized iteration."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class PrefillCandidate:
    request_id: str
    arrival_seq: int
    cost_tokens: int
    pages_needed: int


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: tuple[str, ...]
    deficit_tokens: int
    memory_stalled: bool
    seat_stalled: bool = False


_NOTHING_WAITS = Admission((), 0, False)


def seat_decodes(num_ready: int, *, num_active: int, max_active_decodes: int) -> int:
    """How many prefilled-and-waiting blocks to seat now, from the front (arrival order)."""
    return max(0, min(num_ready, max_active_decodes - num_active))


def credit_floor(token_budget: int | None, share: float) -> int:
    return 0 if token_budget is None else max(1, int(token_budget * share))


def admit(waiting: Sequence[PrefillCandidate], *, decode_tokens: int, token_budget: int | None,
          deficit_tokens: int, free_pages: int, num_active: int, num_ready: int,
          max_active_decodes: int, credit_share: float = 0.125) -> Admission:
    if not waiting:
        return _NOTHING_WAITS
    unlimited = token_budget is None
    earned = 0 if unlimited else max(token_budget - decode_tokens, credit_floor(token_budget, credit_share))
    avail = float("inf") if unlimited else earned + deficit_tokens
    seats = max_active_decodes - num_active - num_ready
    admitted: list[str] = []
    spent = 0
    memory_stalled = seat_stalled = False
    for c in waiting:
        if len(admitted) >= seats:
            seat_stalled = True
            break
        if c.pages_needed and (memory_stalled or c.pages_needed > free_pages):
            memory_stalled = True
            continue
        idle = num_active == 0 and not admitted
        if spent + c.cost_tokens > avail and not idle:
            break
        admitted.append(c.request_id)
        spent += c.cost_tokens
        free_pages -= c.pages_needed
    if unlimited or len(admitted) == len(waiting):
        deficit = 0
    elif memory_stalled or seat_stalled:
        deficit = max(0, deficit_tokens - max(0, spent - earned))
    else:
        deficit = max(0, int(avail - spent))
    return Admission(tuple(admitted), deficit, memory_stalled, seat_stalled)
