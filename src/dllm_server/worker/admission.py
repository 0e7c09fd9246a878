"""Deficit token-budget admission: pure functions, no state, no I/O, no torch.

Per worker iteration (reference/sangam.md §2, with its starvation hole closed):
1. `seat_decodes`: prefilled blocks waiting for a decode seat are seated in arrival order up to
   `max_active_decodes`. Seated decodes are never displaced.
2. `admit`: waiting prefills / re-prefills (cost = whole canvas, indivisible) are admitted in
   strict arrival order while `spent + cost <= avail`, where
       avail = max(token_budget - decode_tokens, credit_floor) + deficit_tokens.
   `credit_floor` (a share of the budget) is what a waiting prefill earns per iteration even
   when decodes alone exceed the budget, so every prefill is admitted within
   ceil(cost / credit_floor) budget-limited iterations: no starvation under any decode load.
   Idle rule: with no seated decode and nothing admitted yet, the head goes in whatever it costs.
   The scan stops at the first candidate that does not fit (no overtaking). A candidate also
   needs its KV pages and a seat (seated + prefilled-waiting + admitted < max_active_decodes).
   One exception, for liveness: behind a head stalled on memory, blocks that already hold their
   pages (a continued block, `pages_needed == 0`) may still go in under the budget and seat rules;
   no later block that needs pages may. Pages come back only when holders finish, so a head that
   waits for pages behind holders that wait for it would deadlock (found by the simulator).
3. Deficit: unused credit carries forward (`avail - spent`, never negative) while blocks still
   wait; it resets to 0 when nothing waits or every waiting block was admitted (deficit round
   robin's rule: credit from a turn with little to admit must not let a burst that arrives next
   in as one oversized iteration: 21 prefills, 0.83 s, measured before the rule); a stall on
   memory or seats earns no new credit (only the old deficit carries, minus what admissions
   overspent).
`token_budget=None` means unlimited (prefill priority).
"""
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


_NOTHING_WAITS = Admission((), 0, False)     # the usual answer, made once (it is immutable)


def seat_decodes(num_ready: int, *, num_active: int, max_active_decodes: int) -> int:
    """How many prefilled-and-waiting blocks to seat now (taken from the front, arrival order)."""
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
            memory_stalled = True      # this one and every later one needing pages wait; holders may pass
            continue
        idle = num_active == 0 and not admitted
        if spent + c.cost_tokens > avail and not idle:
            break
        admitted.append(c.request_id)
        spent += c.cost_tokens
        free_pages -= c.pages_needed
    if unlimited or len(admitted) == len(waiting):
        deficit = 0        # the queue emptied: unused credit does not carry (DRR), or a burst after a
        #                    light turn would come in as one oversized iteration
    elif memory_stalled or seat_stalled:
        deficit = max(0, deficit_tokens - max(0, spent - earned))
    else:
        deficit = max(0, int(avail - spent))
    return Admission(tuple(admitted), deficit, memory_stalled, seat_stalled)
