"""Leases: a request's next block continued on the worker that runs its current one, when the
router would put it there anyway (its canvas stays resident; no re-dispatch round trip). The
scheduler (`sched` below: scheduler/scheduler.py's Scheduler) collects the blocks that continued in
a tick and decides their leases in one batched policy call here."""
from __future__ import annotations

from ..decoding.params import BlockPolicy
from ..messages import ContinueBlock, Evict
from .placement import WorkerLoad, keeps_request
from .request_table import Entry


def completion(sched, entry: Entry) -> dict[int, float] | None:
    """Predicted completion of the request's next block per worker (routing = completion)."""
    if sched.config.routing == "completion" and sched.config.placement == "colocated":
        return sched.load.completion_estimates(range(len(sched.workers)), entry.state)
    return None


def keeps(sched, entry: Entry, wid: int, loads: list[WorkerLoad] | None = None) -> bool:
    """Would the router run the request's next block on `wid`, where its current one runs?"""
    st = entry.state
    if st.block_index + 1 >= st.num_blocks:
        return False
    if st.params.block_causal:      # sticky: its pages hold exact KV, the worker goes on where it is
        return True
    loads = loads or sched.workers.loads(minus=entry.charged)   # the others' load, not this block's
    return keeps_request(loads, sched.config.placement, wid, sched.workers.pages_for(st.prompt_len + st.answer_len),
                         completion(sched, entry))


def lease(sched, entry: Entry, wid: int, loads: list[WorkerLoad] | None = None) -> BlockPolicy | None:
    """The next block's policy if the router would keep the request on `wid`, else None."""
    st = entry.state
    return sched.policy.block_policy(st, st.block_index + 1) if keeps(sched, entry, wid, loads) else None


def grant_leases(sched, pending: list) -> None:
    """Leases for the blocks that continued in place this tick ((entry, worker, block) each), the
    policy asked once for all."""
    live = [(e, w) for e, w, k in pending if not e.done and e.worker == w and e.state.block_index == k]
    pending.clear()
    for e, w in live:
        if sched.workers[w].planned:      # continued on an instance being drained: ask the block back
            sched.send(w, Evict(e.state.request_id, e.state.block_index))
    todo = [(e, w) for e, w in live if keeps(sched, e, w)]
    for (e, w), then in zip(todo, sched.policy.block_policies([(e.state, e.state.block_index + 1) for e, _ in todo])):
        sched.requests.set_lease(e, then)
        sched.send(w, ContinueBlock(e.state.request_id, e.state.block_index, then))
