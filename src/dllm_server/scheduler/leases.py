"""Leases: a request's next block continued on the worker running its current one when the router would put
it there anyway (the canvas stays resident; no re-dispatch round trip)."""
from __future__ import annotations

import math
from typing import Callable

from ..costmodel.worker_speed import WorkerLoadModel
from ..decoding.params import BlockPolicy
from ..messages import ContinueBlock, Evict
from ..policy.base import DecodePolicy
from .placement import WorkerLoad, keeps_request, slo_class
from .request_table import Entry, RequestTable
from .worker_table import WorkerTable


class Leases:
    """Decides leases; a tick's continued blocks are leased together, the policy asked once for all."""

    def __init__(self, placement: str, routing: str, workers: WorkerTable, requests: RequestTable,
                 load: WorkerLoadModel, policy: DecodePolicy, send: Callable[[int, object], None],
                 ordered: Callable[[Entry, BlockPolicy], BlockPolicy], clock: Callable[[], float]):
        self.by_completion = routing in ("completion", "slo-class") and placement == "colocated"
        self.by_class = routing == "slo-class" and placement == "colocated"
        self.clock = clock
        self.placement, self.workers, self.requests = placement, workers, requests
        self.load, self.policy, self.send, self.ordered = load, policy, send, ordered
        self.pending: list[tuple[Entry, int, int]] = []      # (entry, worker, block)

    def completion(self, entry: Entry, loads: list[WorkerLoad] | None = None) -> dict[int, float] | None:
        """Predicted completion of the next block per worker (routing = completion), of the workers its SLO class
        may use (routing = slo-class)."""
        if not self.by_completion:
            return None
        loads = loads or self.workers.loads()
        st = entry.state
        est = self.load.completion_estimates(range(len(self.workers)), st,
                                             {w.worker_id: w.outstanding_prefill_tokens for w in loads})
        if not self.by_class:
            return est
        slo = st.sampling.slo_ms
        left = math.inf if slo is None else slo / 1e3 - (self.clock() - st.arrived_at)
        per_block = left / max(1, st.num_blocks - st.block_index)
        keep = slo_class(est, self.load.alone_estimates(est, st), per_block)
        return {w: c for w, c in est.items() if w in keep}

    def keeps(self, entry: Entry, wid: int, loads: list[WorkerLoad] | None = None) -> bool:
        """Would the router run the request's next block on `wid`, where its current one runs?"""
        st = entry.state
        if st.block_index + 1 >= st.num_blocks:
            return False
        if st.params.block_causal:      # sticky: its pages hold exact KV
            return True
        loads = loads or self.workers.loads(minus=entry)   # the others' load, not this block's
        return keeps_request(loads, self.placement, wid, self.workers.pages_for(st.prompt_len + st.answer_len),
                             self.completion(entry, loads))

    def lease(self, entry: Entry, wid: int, loads: list[WorkerLoad] | None = None) -> BlockPolicy | None:
        st = entry.state
        if not self.keeps(entry, wid, loads):
            return None
        return self.ordered(entry, self.policy.block_policy(st, st.block_index + 1))

    def defer(self, entry: Entry, wid: int) -> None:
        self.pending.append((entry, wid, entry.state.block_index))

    def grant(self) -> None:
        if not self.pending:
            return
        live = [(e, w) for e, w, k in self.pending if not e.done and e.worker == w and e.state.block_index == k]
        self.pending.clear()
        for e, w in live:
            if self.workers[w].planned:      # continued on an instance being drained: ask the block back
                self.send(w, Evict(e.state.request_id, e.state.block_index))
        todo = [(e, w) for e, w in live if self.keeps(e, w)]
        policies = self.policy.block_policies([(e.state, e.state.block_index + 1) for e, _ in todo])
        for (e, w), then in zip(todo, policies):
            then = self.ordered(e, then)
            self.requests.set_lease(e, then)
            self.send(w, ContinueBlock(e.state.request_id, e.state.block_index, then))
