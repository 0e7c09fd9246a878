"""The central scheduler: routes blocks, leases continuations, advances, finishes and evicts requests. Synchronous,
with an injected clock and `send`, so the server, the simulator and the offline LLM drive the same one."""
from __future__ import annotations

import collections
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable

from ..decoding.params import BlockPolicy
from ..messages import (Abort, BlockDone, ContinueBlock, ReviseBlock, Evicted, HandoffDone, InstallKV, KVSent, LoadReport,
                        PrefillDone, StepDelta, WorkerFailed, WorkerReady)
from .handoffs import FallBack, Handoffs, InstallBlock, Moved, Send
from ..request.output import advance, progress_event
from .leases import Leases
from .ordering import FCFS, block_priority, deadline_at, is_late
from .placement import pick_by_completion, pick_prefill_worker
from ..policy.base import DecodePolicy
from ..costmodel.worker_speed import WorkerLoadModel
from ..request.state import GenerationOutput
from ..request.events import STREAM_PROGRESS, STREAM_TEXT, StreamEvent
from .request_table import Entry, RequestTable
from .counters import Counters
from .worker_table import WorkerTable

log = logging.getLogger(__name__)
REORDER_INTERVAL_S = 0.2
MAX_RESUMES = 3               # a request whose worker keeps dying under it (it may be what kills it) then fails      # how often late requests are moved back (the policy revises as often)


@dataclass(slots=True)
class _Retry:
    request_id: str
    policy: BlockPolicy
    any_role: bool
    step_offset: int
    restart: bool = False


class Scheduler:
    """A driver calls `add` / `abort` / `on_messages` as things happen, then `tick()` once at the
    end of its turn: an observing policy's decisions of the turn are made there together."""

    def __init__(self, config, roles: list[str], tokenizer, send: Callable[[int, object], None],
                 policy: DecodePolicy, clock: Callable[[], float] = time.monotonic,
                 load: WorkerLoadModel | None = None, batch_arrivals: bool = False):
        self.config = config
        self.default_slo_s = None if config.default_slo_ms is None else config.default_slo_ms / 1e3
        self.tokenizer = tokenizer
        self.send = send
        self.policy = policy
        self.clock = clock
        self.theta = config.overflow_threshold_tokens
        self.workers = WorkerTable(roles, config.page_size, config.worker_policy())
        self.load = load if load is not None else WorkerLoadModel(config.block_length)
        self.requests = RequestTable()
        self.counters = Counters()
        self.handoffs = Handoffs(self.workers, config.kv_transfer == "layerwise", clock, self.counters)
        self.trace: collections.deque = collections.deque(maxlen=20000)   # (at, LoadReport) per iteration
        self.ticks, self.tick_s = 0, 0.0
        self.leases = Leases(config.placement, config.routing, self.workers, self.requests, self.load, policy, send,
                             self.ordered, clock)
        self.order, self._reordered_at = config.scheduling_policy, -1e9
        self.failure: str | None = None
        # an observing policy decides a turn's arrivals together: one at a time, a burst's first iteration
        # would seat only its first request
        self.batch_arrivals = batch_arrivals
        self._arrivals: list[Entry] = []
        self._revise_due = False

    def add(self, entry: Entry) -> None:
        entry.arrived_at = entry.state.arrived_at = self.clock()
        self.requests.add(entry)
        if self.batch_arrivals and self.policy.observes:
            self._arrivals.append(entry)
        else:
            self._dispatch(entry, self._block_policy(entry))

    def tick(self) -> None:
        """End of the driver's turn: admit its arrivals together, then the policy's revisions, then places in line."""
        if self._arrivals:
            self._admit_arrivals()
        if self._revise_due:
            self._revise_due = False
            self._revise()
        if self.order != FCFS and self.clock() - self._reordered_at >= REORDER_INTERVAL_S:
            self._reorder()

    def ordered(self, entry: Entry, policy: BlockPolicy) -> BlockPolicy:
        """`policy` with the request's place in line (scheduler/ordering.py)."""
        if self.order == FCFS:
            return policy
        st = entry.state
        slo_s = st.sampling.slo_ms / 1e3 if st.sampling.slo_ms is not None else self.default_slo_s
        late = is_late(slo_s, deadline_at(entry.arrived_at, slo_s, self.config.default_deadline_s), self.clock(),
                       self.policy.is_hopeless(st.request_id))
        p = block_priority(self.order, entry.arrived_at, slo_s, self.config.default_deadline_s, late)
        if late and not entry.yielded:
            entry.yielded = True
            self.counters.requests_yielded += 1
        return policy if p == policy.priority else dataclasses.replace(policy, priority=p)

    def _reorder(self) -> None:
        """Blocks whose place in line moved since they were sent (their request turned late) get it now."""
        self._reordered_at = self.clock()
        for e in self.requests:
            if e.worker is None or e.policy is None:
                continue
            now = self.ordered(e, e.policy)
            if now is not e.policy:
                e.policy = now
                self.send(e.worker, ReviseBlock(e.state.request_id, e.state.block_index, now))
            if e.lease is not None and (then := self.ordered(e, e.lease)) is not e.lease:
                self.requests.set_lease(e, then)
                self.send(e.worker, ContinueBlock(e.state.request_id, e.state.block_index, then))

    @property
    def has_tick_work(self) -> bool:
        return bool(self._arrivals) or self._revise_due

    @property
    def is_ready(self) -> bool:
        return self.workers.all_ready

    def _admit_arrivals(self) -> None:
        arrivals = [e for e in self._arrivals if not e.done and e.worker is None]
        self._arrivals.clear()
        if not arrivals:
            return
        policies = self.policy.block_policies([(e.state, e.state.block_index) for e in arrivals])
        for entry, policy in zip(arrivals, policies):
            self._dispatch(entry, policy, lease_later=True)
        self.leases.grant()

    def abort(self, request_id: str, reason: str = "abort", error: str | None = None) -> None:
        entry = self.requests.get(request_id)
        if entry is not None:
            self._finish(entry, entry.state.finish(finish_reason=reason, error=error), abort_worker=True)

    def _block_policy(self, entry: Entry, block_index: int | None = None) -> BlockPolicy:
        st = entry.state
        return self.policy.block_policy(st, st.block_index if block_index is None else block_index)

    def _dispatch(self, entry: Entry, policy: BlockPolicy, any_role: bool = False, step_offset: int = 0,
                  lease_later: bool = False, restart: bool = False) -> None:
        st = entry.state
        tokens = st.prompt_len + st.answer_len
        pages = self.workers.pages_for(tokens)
        loads = self.workers.loads()
        if any_role:   # fallback after a refused handoff: decode locally anywhere
            loads = [dataclasses.replace(w, role="colocated") for w in loads]
            wid = pick_prefill_worker(loads, "colocated", pages, 0)
        else:
            est = self.leases.completion(entry, loads)
            wid = pick_by_completion(loads, est, pages) if est else \
                pick_prefill_worker(loads, self.config.placement, pages, self.theta)
        if wid is None:
            self.requests.pending.append(_Retry(st.request_id, policy, any_role, step_offset, restart))
            return
        policy = self.ordered(entry, policy)
        role = self.workers[wid].role
        if role == "decode":
            self.counters.prefills_overflowed += 1
        handoff = role == "prefill" and not any_role
        stream_to = self.handoffs.begin(st.request_id, st.block_index, wid, pages, policy) if handoff else None
        then = None if handoff or lease_later else self.leases.lease(entry, wid, loads)
        self.requests.set_lease(entry, then)
        if lease_later and not handoff:
            self.leases.defer(entry, wid)
        msg = st.submit_msg(policy, then, step_offset, restart)
        entry.policy = policy
        if handoff:
            msg = dataclasses.replace(msg, handoff=True, stream_to=stream_to)
        self.workers.hold(entry, wid)
        self.workers.charge(entry, wid, tokens)
        self.send(wid, msg)

    def _finish(self, entry: Entry, output: GenerationOutput, abort_worker: bool) -> None:
        rid = entry.state.request_id
        if abort_worker and entry.worker is not None and self.workers[entry.worker].alive:
            self.send(entry.worker, Abort(rid))
        self.workers.uncharge(entry)
        self.workers.hold(entry, None)
        self.requests.set_lease(entry, None)
        self._run(self.handoffs.release(rid))
        self.requests.remove(entry)
        now = self.clock()
        output.stats.latency_s = now - entry.arrived_at
        if self.policy.observes:
            self.policy.on_finish(entry.state, output, now)
        entry.events.put_nowait(StreamEvent(rid, output=output))

    def on_messages(self, wid: int, batch: list) -> None:
        """One worker's batch (one turn of its pump), then its leases and the retries it allows."""
        t0 = time.perf_counter()
        for msg in batch:
            if isinstance(msg, LoadReport):
                if self.workers.on_report(wid, msg):
                    self.trace.append((self.clock(), msg))
                    self.counters.canvas_positions += msg.iteration_tokens
                self.load.observe(wid, msg)
            elif isinstance(msg, KVSent):
                self._run(self.handoffs.on_kv_sent(msg))
            elif isinstance(msg, HandoffDone):
                self._run(self.handoffs.on_handoff_done(msg))
            elif isinstance(msg, WorkerReady):
                self.workers.on_ready(msg)
                self.load.seed(wid, msg.profile, msg.tp_size)
            elif isinstance(msg, WorkerFailed):
                log.error("worker %d failed:\n%s", wid, msg.traceback)
                self.failure = self.failure or f"worker {wid} failed to start:\n{msg.traceback}"
            else:
                entry = self.requests.get(msg.request_id)
                if entry is not None:
                    self._on_request_message(entry, wid, msg)
        self.leases.grant()
        self.retry_waiting()
        if self.policy.observes:
            self._revise_due = True
        self.ticks += 1
        self.tick_s += time.perf_counter() - t0

    def _revise(self) -> None:
        for rid, k, policy in self.policy.revise(self.requests, self.clock()):
            entry = self.requests.get(rid)
            if entry is not None:
                policy = self.ordered(entry, policy)
            if (out := self.requests.revision(rid, k, policy)) is not None:
                self.send(*out)

    def retry_waiting(self) -> None:
        """Held handoffs and blocks that found no worker with room, tried again."""
        self._run(self.handoffs.retry_held())
        pending = self.requests.pending
        waiting = [pending.popleft() for _ in range(len(pending))]
        if self.order != FCFS:       # the earliest deadline gets the first worker with room
            waiting.sort(key=lambda r: self.ordered(e, r.policy).priority if (e := self.requests.get(r.request_id))
                         else 0.0)
        for r in waiting:
            entry = self.requests.get(r.request_id)
            if entry is not None:
                self._dispatch(entry, r.policy, r.any_role, r.step_offset, restart=r.restart)

    def _on_step(self, entry: Entry, wid: int, msg: StepDelta) -> None:
        if msg.step == 0 or entry.charged is not None:
            self.workers.uncharge(entry)
        self.requests.started(entry)
        now = None
        if entry.first_step_at is None:
            entry.first_step_at = now = self.clock()
        if msg.positions and entry.first_token_at is None:
            entry.first_token_at = now or self.clock()
        self.handoffs.on_step(entry.state.request_id, wid)

    def _on_request_message(self, entry: Entry, wid: int, msg) -> None:
        st = entry.state
        if isinstance(msg, StepDelta):
            self._on_step(entry, wid, msg)
        elif isinstance(msg, Evicted):
            if msg.removed and entry.worker == wid and st.block_index == msg.block_index:
                self.workers.uncharge(entry)
                self.workers.hold(entry, None)
                self.counters.blocks_evicted += 1
                self._dispatch(entry, self._block_policy(entry))
            return
        elif isinstance(msg, PrefillDone):
            self._run(self.handoffs.on_prefill_done(st.request_id, msg))
            return
        outcome = advance(st, msg)
        if self.policy.observes:
            if isinstance(msg, StepDelta):
                self.policy.on_step(st, msg, wid, self.clock())
            elif isinstance(msg, BlockDone):
                self.policy.on_block_done(st, msg)
        if outcome.output is None:
            if entry.stream == STREAM_PROGRESS and isinstance(msg, StepDelta):
                entry.events.put_nowait(progress_event(st, msg, self.tokenizer))
            elif entry.stream == STREAM_TEXT and outcome.added:      # token editing: also at a block's end
                entry.events.put_nowait(StreamEvent(st.request_id, text=st.text, logprobs=st.take_logprobs()))
        if isinstance(msg, BlockDone):
            self.workers.uncharge(entry)
            entry.policy = entry.lease if outcome.continued else None     # a lease is the next block's policy
            self.requests.set_lease(entry, None)
            self._run(self.handoffs.release(st.request_id))
            self.workers.hold(entry, wid if outcome.continued else None)
        if outcome.output is not None:
            self._finish(entry, outcome.output, abort_worker=outcome.abort_worker)
        elif outcome.continued:
            self.counters.blocks_continued += 1
            if not st.params.block_causal:          # a re-prefill to come there (block-causal: none)
                self.workers.charge(entry, wid, st.prompt_len + st.answer_len)
            self.leases.defer(entry, wid)
        elif outcome.next_block:
            self._dispatch(entry, self._block_policy(entry))

    def _run(self, actions: list) -> None:
        for a in actions:
            if isinstance(a, Send):
                self.send(a.worker, a.msg)
                continue
            entry = self.requests.get(a.request_id)
            if entry is None:
                continue
            if isinstance(a, InstallBlock):
                then = self.leases.lease(entry, a.dst) if entry.state.params.block_causal else None
                self.requests.set_lease(entry, then)
                entry.policy = a.policy
                self.send(a.dst, InstallKV(entry.state.submit_msg(a.policy, then, step_offset=a.steps)))
            elif isinstance(a, Moved):
                self.workers.hold(entry, a.dst)
            elif isinstance(a, FallBack):
                self.workers.hold(entry, None)
                self._dispatch(entry, a.policy, any_role=True, step_offset=a.steps)

    def set_policy(self, worker_id: int | None = None, overflow_threshold_tokens: int | None = None,
                   **changes) -> None:
        """Change worker policies (tau, seat cap, credit share) from their next iteration, and the router's theta."""
        if overflow_threshold_tokens is not None:
            if overflow_threshold_tokens < 0:
                raise ValueError(f"overflow_threshold_tokens: must be >= 0, got {overflow_threshold_tokens}")
            self.theta = overflow_threshold_tokens
        for wid, msg in self.workers.set_policy(worker_id, changes):
            self.send(wid, msg)

    def on_worker_lost(self, worker_ids: list[int], reason: str, resume: bool = True) -> None:
        """Every request whose block lived on a lost worker is resumed from that block's start on another worker
        (or the restarted one: it waits in the pending queue), never lost; it fails only when nothing will serve
        it again (`resume` False: the engine is dead) or its worker died under it MAX_RESUMES times."""
        lost = set(worker_ids)
        self.workers.lost(lost)
        for entry in self.requests:
            rid = entry.state.request_id
            dst = self.handoffs.dst(rid)
            if entry.worker not in lost and dst not in lost:
                continue
            if entry.charged is not None and entry.charged[0] in lost:
                entry.charged = None
            if dst in lost:
                self.handoffs.forget(rid)
            if not resume or entry.resumes >= MAX_RESUMES:
                why = reason if not resume else f"{reason} (its worker died {entry.resumes + 1} times under it)"
                self._finish(entry, entry.state.finish(finish_reason="error", error=why), abort_worker=True)
                continue
            entry.resumes += 1
            self.counters.requests_resumed += 1
            if entry.worker is not None and entry.worker not in lost:    # the live end of a handoff drops it
                self.send(entry.worker, Abort(rid))
            self._run(self.handoffs.release(rid))
            self.workers.uncharge(entry)
            self.requests.set_lease(entry, None)
            self.workers.hold(entry, None)
            self._dispatch(entry, self._block_policy(entry), restart=True)
