"""Pure placement policy: which worker runs a (re-)prefill and which decodes after a handoff. Deterministic
(ties go to the lowest worker id); no clocks, no I/O."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    worker_id: int
    role: str                          # "colocated" | "prefill" | "decode"
    outstanding_prefill_tokens: int
    free_pages: int                    # reported free pages minus pending reservations
    num_pages: int
    available: bool
    active_decodes: int = 0            # in its latest report: the tie-break (all idle read 0 prefill tokens)
    holding: int = 0                   # requests whose current block it holds (the front's count: reports lag)
    tp_size: int = 1


def _least_outstanding(cands: list[WorkerLoad]) -> int | None:
    if not cands:
        return None
    return min(cands, key=lambda w: (w.outstanding_prefill_tokens, w.active_decodes, w.worker_id)).worker_id


def pick_prefill_worker(loads: list[WorkerLoad], placement: str, pages_needed: int,
                        overflow_threshold_tokens: int) -> int | None:
    """Least outstanding prefill tokens among workers whose pool could hold the canvas (prefill workers unless
    colocated); hybrid overflows onto a decode worker once EVERY prefill worker is above theta."""
    fit = [w for w in loads if w.available and w.num_pages >= pages_needed]
    if placement == "colocated":
        return _least_outstanding(fit)
    prefill = [w for w in fit if w.role == "prefill"]
    if placement == "hybrid":
        if prefill and all(w.outstanding_prefill_tokens > overflow_threshold_tokens for w in prefill):
            decode = [w for w in fit if w.role == "decode"]
            if decode:
                return _least_outstanding(decode)
    return _least_outstanding(prefill)


def pick_decode_worker(loads: list[WorkerLoad], pages_needed: int) -> int | None:
    """The decode worker with the most free pages that can hold the block now."""
    cands = [w for w in loads if w.available and w.role == "decode" and w.free_pages >= pages_needed]
    if not cands:
        return None
    return max(cands, key=lambda w: (w.free_pages, -w.worker_id)).worker_id


def worker_roles(placement: str, num_workers: int, num_prefill_workers: int) -> list[str]:
    """Worker id -> role; prefill workers come first."""
    if placement == "colocated":
        return ["colocated"] * num_workers
    return ["prefill"] * num_prefill_workers + ["decode"] * num_workers


# Predicted completions this close count as equal: a step-time model prices a memory-bound decode at batch 1 and 2
# alike, so on its estimate alone a burst herds onto one worker (docs/reconfiguration.md "Routing").
COMPLETION_TIE = 0.05


def pick_by_completion(loads: list[WorkerLoad], completion_s: dict[int, float], pages_needed: int) -> int | None:
    """DiLaServe's instance selection: the earliest predicted completion among workers that could hold the canvas,
    near-ties (within COMPLETION_TIE) to the least loaded."""
    fit = [w for w in loads if w.available and w.num_pages >= pages_needed and w.worker_id in completion_s]
    if not fit:
        return None
    best = min(completion_s[w.worker_id] for w in fit)
    return _least_outstanding([w for w in fit if completion_s[w.worker_id] <= best * (1 + COMPLETION_TIE)])


# SLO-class routing (DiLaServe): a block goes to the slowest class of instance that still finishes it within this share
# of the request's budget per block left, so the faster instances stay free for the requests that need them; instances
# whose block alone takes within CLASS_TIE of the slowest's are one class.
SLO_FIT, CLASS_TIE = 0.5, 0.2


def slo_class(completion_s: dict[int, float], alone_s: dict[int, float], block_budget_s: float) -> set[int]:
    """The workers SLO-class routing may send a block to: of those whose predicted completion fits SLO_FIT of
    `block_budget_s` (inf: no SLO), the slowest class by `alone_s` (the block on the idle worker); all when none fits,
    so a request that fits nowhere goes where it finishes first."""
    fits = [w for w, c in completion_s.items() if c <= SLO_FIT * block_budget_s]
    if not fits:
        return set(completion_s)
    slowest = max(alone_s[w] for w in fits)
    return {w for w in fits if alone_s[w] * (1 + CLASS_TIE) >= slowest}


def keeps_request(loads: list[WorkerLoad], placement: str, current: int, pages_needed: int,
                  completion_s: dict[int, float] | None = None) -> bool:
    """Would the router run the next block where the current one runs (colocated only; ties stay put)?
    `loads` must not count the request's own current block."""
    if placement != "colocated":
        return False
    fit = [w for w in loads if w.available and w.num_pages >= pages_needed]
    here = next((w for w in fit if w.worker_id == current), None)
    if here is None or (completion_s is not None and current not in completion_s):
        return False
    if completion_s is not None:
        rivals = fit
        if here.holding == 0 and here.outstanding_prefill_tokens == 0:
            # alone there, only a faster instance can be worth a move (it costs the lease); workers' own step-time
            # models differ by more than the tie, and moved such a request every block
            rivals = [w for w in fit if w.tp_size > here.tp_size]
        return all(completion_s[current] <= (1 + COMPLETION_TIE) * completion_s.get(w.worker_id, float("inf"))
                   for w in rivals)
    return all(here.outstanding_prefill_tokens <= w.outstanding_prefill_tokens for w in fit)
