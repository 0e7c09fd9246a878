"""The central scheduler: one coroutine on the front process's asyncio loop that owns every
request's state. It routes prefills and re-prefills by load, hands prefilled blocks to decode
workers in disaggregated / hybrid placement, advances requests on worker messages, finishes,
aborts and evicts them, and reacts to worker deaths. Placement math lives in placement.py."""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from dataclasses import dataclass

from ..config import ServerConfig
from ..messages import (Abort, BlockDone, HandoffDone, HandoffKV, InstallKV, KVSent, LoadReport, PrefillDone,
                        ReceiveKV, StepDelta, SubmitBlock, WorkerFailed, WorkerReady)
from .output import advance, canvas_text, visible_text
from .placement import WorkerLoad, pick_decode_worker, pick_prefill_worker
from .request_state import GenerationOutput, RequestState
from .tokenize import Tokenizer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StreamEvent:
    """What a client sees: a step's delta (and, when streaming, the visible text so far), or the
    final output."""
    request_id: str
    delta: StepDelta | None = None
    text: str | None = None
    canvas: str | None = None
    output: GenerationOutput | None = None


@dataclass(slots=True)
class Entry:
    state: RequestState
    events: asyncio.Queue
    stream_text: bool
    arrived_at: float
    stream_canvas: bool = False
    worker: int | None = None          # worker holding the current block
    handoff: Handoff | None = None     # the current block's move to a decode worker
    charged: tuple[int, int] | None = None   # (worker, tokens) counted as outstanding prefill
    started: bool = False              # first step seen (no longer waiting)
    first_token_at: float | None = None
    first_step_at: float | None = None
    stalled_since: float | None = None  # PrefillDone of a handoff; cleared by the block's first decode step

    @property
    def decode_worker(self) -> int | None:
        return self.handoff.dst if self.handoff is not None else None


@dataclass(slots=True)
class Handoff:
    """A block's move from its prefill worker to a decode worker. It completes when both the
    prefill step is done (PrefillDone: the canvas the decode continues from) and the receiver
    has the KV (HandoffDone); with streaming either can come first."""
    block_index: int
    pages: int
    dst: int | None = None             # None: no decode worker had room yet
    reserved: bool = False             # `pages` counted in dst's reserved_pages
    steps: int | None = None           # forwards the block took on the prefill worker
    relayed: bool = False              # the sender's KVSent went to dst: it has posted its receives
    kv_ok: bool | None = None          # receiver's verdict: in place / refused (drained)


@dataclass(slots=True)
class WorkerInfo:
    worker_id: int
    role: str
    ready: bool = False
    alive: bool = True
    num_pages: int = 0
    page_size: int = 16
    pid: int | None = None
    report: LoadReport | None = None
    reserved_pages: int = 0
    outstanding_prefill_tokens: int = 0


@dataclass(slots=True)
class Counters:
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0
    kv_transfers_failed: int = 0
    kv_handoffs: int = 0
    kv_handoff_stall_seconds: float = 0.0   # PrefillDone -> first decode step on the decode worker
    prefills_overflowed: int = 0
    worker_restarts: int = 0
    canvas_positions: int = 0


class Scheduler:
    def __init__(self, config: ServerConfig, roles: list[str], tokenizer: Tokenizer | None, send):
        self.config = config
        self.tokenizer = tokenizer
        self.send = send                               # (worker_id, msg) -> None
        self.workers = [WorkerInfo(i, r) for i, r in enumerate(roles)]
        self.requests: dict[str, Entry] = {}
        self.pending: collections.deque[str] = collections.deque()   # no worker could take them yet
        self.decode_ready: collections.deque[str] = collections.deque()
        self.num_waiting = 0
        self.counters = Counters()
        self.trace: collections.deque = collections.deque(maxlen=20000)   # (at, LoadReport) per iteration
        self.ready_event = asyncio.Event()
        self.failed_event = asyncio.Event()
        self.failure: str | None = None                # startup failure of a worker
        self.model_args = None                         # from WorkerReady

    # ---- worker table ----
    def loads(self) -> list[WorkerLoad]:
        out = []
        for w in self.workers:
            free = (w.report.free_pages if w.report else w.num_pages) - w.reserved_pages
            out.append(WorkerLoad(w.worker_id, w.role, w.outstanding_prefill_tokens, free, w.num_pages,
                                  w.ready and w.alive))
        return out

    @property
    def is_healthy(self) -> bool:
        return all(w.ready and w.alive for w in self.workers)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.workers[0].page_size)

    def min_capacity_pages(self) -> int:
        roles = {"prefill"} if any(w.role == "prefill" for w in self.workers) else {"colocated"}
        return min(w.num_pages for w in self.workers if w.role in roles)

    # ---- requests ----
    def add(self, entry: Entry) -> None:
        self.requests[entry.state.request_id] = entry
        self.num_waiting += 1
        self._dispatch(entry, entry.state.submit_msg())

    def abort(self, request_id: str, reason: str = "abort") -> None:
        entry = self.requests.get(request_id)
        if entry is None:
            return
        self._finish(entry, entry.state.finish(visible_text(entry.state, self.tokenizer), finish_reason=reason),
                     abort_worker=True)

    def _dispatch(self, entry: Entry, msg: SubmitBlock, allow_any_role: bool = False) -> None:
        st = entry.state
        tokens = msg.canvas.numel()
        loads = self.loads()
        if allow_any_role:   # fallback after a refused handoff: decode locally anywhere
            loads = [WorkerLoad(w.worker_id, "colocated", w.outstanding_prefill_tokens, w.free_pages,
                                w.num_pages, w.available) for w in loads]
            wid = pick_prefill_worker(loads, "colocated", self.pages_for(tokens), 0)
        else:
            wid = pick_prefill_worker(loads, self.config.placement, self.pages_for(tokens),
                                      self.config.overflow_threshold_tokens)
        if wid is None:
            self.pending.append(st.request_id)
            return
        role = self.workers[wid].role
        if role == "decode":
            self.counters.prefills_overflowed += 1
        entry.handoff = None
        if role == "prefill" and not allow_any_role:
            entry.handoff = Handoff(msg.block_index, self.pages_for(tokens))
            if self.config.kv_transfer == "layerwise":    # pick the receiver now: stream during prefill
                self._reserve_receiver(entry.handoff)
        stream_to = entry.decode_worker
        if entry.handoff is not None or msg.handoff or msg.stream_to is not None:
            msg = dataclasses.replace(msg, handoff=entry.handoff is not None, stream_to=stream_to)
        entry.worker = wid
        entry.charged = (wid, tokens)
        self.workers[wid].outstanding_prefill_tokens += tokens
        self.send(wid, msg)

    def _uncharge(self, entry: Entry) -> None:
        if entry.charged is not None:
            wid, tokens = entry.charged
            self.workers[wid].outstanding_prefill_tokens -= tokens
            entry.charged = None

    def _finish(self, entry: Entry, output: GenerationOutput, abort_worker: bool) -> None:
        rid = entry.state.request_id
        if abort_worker and entry.worker is not None and self.workers[entry.worker].alive:
            self.send(entry.worker, Abort(rid))
        self._release(entry)
        if not entry.started:
            self.num_waiting -= 1
            entry.started = True
        self.requests.pop(rid, None)     # evicted: memory stays bounded
        entry.events.put_nowait(StreamEvent(rid, output=output))

    def _release(self, entry: Entry) -> None:
        self._uncharge(entry)
        entry.stalled_since = None
        h, entry.handoff = entry.handoff, None
        if h is not None:
            self._unreserve(h)
            if h.dst is not None and h.relayed and h.kv_ok is not False and self.workers[h.dst].alive:
                self.send(h.dst, Abort(entry.state.request_id))   # frees its pages once the data is in

    # ---- worker messages ----
    def on_messages(self, wid: int, batch: list) -> None:
        for msg in batch:
            if isinstance(msg, LoadReport):
                prev = self.workers[wid].report
                if prev is None or msg.num_iterations > prev.num_iterations:
                    self.trace.append((time.monotonic(), msg))
                    self.counters.canvas_positions += msg.iteration_tokens
                self.workers[wid].report = msg
            elif isinstance(msg, WorkerReady):
                self._on_ready(msg)
            elif isinstance(msg, WorkerFailed):
                log.error("worker %d failed:\n%s", wid, msg.traceback)
                if not self.ready_event.is_set():
                    self.startup_failed(f"worker {wid} failed to start:\n{msg.traceback}")
            elif isinstance(msg, HandoffDone):
                self._on_handoff_done(msg)
            elif isinstance(msg, KVSent):
                self._relay(msg)
            else:
                entry = self.requests.get(msg.request_id)
                if entry is not None:
                    self._on_request_message(entry, wid, msg)
        self._retry_waiting()

    def startup_failed(self, reason: str) -> None:
        self.failure = self.failure or reason
        self.failed_event.set()

    def _on_ready(self, msg: WorkerReady) -> None:
        w = self.workers[msg.worker_id]
        w.ready, w.alive, w.num_pages, w.page_size, w.pid = True, True, msg.num_pages, msg.page_size, msg.pid
        w.report, w.reserved_pages, w.outstanding_prefill_tokens = None, 0, 0
        self.model_args = msg.model_args
        if all(x.ready for x in self.workers):
            self.ready_event.set()

    def _on_request_message(self, entry: Entry, wid: int, msg) -> None:
        st = entry.state
        if isinstance(msg, StepDelta):
            if msg.step == 0 or entry.charged is not None:
                self._uncharge(entry)
            if not entry.started:
                entry.started = True
                self.num_waiting -= 1
            if entry.first_step_at is None:
                entry.first_step_at = time.monotonic()
            if msg.positions and entry.first_token_at is None:
                entry.first_token_at = time.monotonic()
            if entry.stalled_since is not None and wid == entry.worker and entry.handoff is None:
                self.counters.kv_handoffs += 1
                self.counters.kv_handoff_stall_seconds += time.monotonic() - entry.stalled_since
                entry.stalled_since = None
        if isinstance(msg, PrefillDone):
            self._on_prefill_done(entry, msg)
            return
        outcome = advance(st, msg, self.tokenizer)
        if isinstance(msg, StepDelta) and outcome.output is None:
            text = visible_text(st, self.tokenizer) if entry.stream_text else None
            canvas = canvas_text(st, self.tokenizer) if entry.stream_canvas else None
            entry.events.put_nowait(StreamEvent(st.request_id, delta=msg, text=text, canvas=canvas))
        if isinstance(msg, BlockDone):
            entry.worker = None
            self._release(entry)
        if outcome.output is not None:
            self._finish(entry, outcome.output, abort_worker=outcome.abort_worker)
        elif outcome.next_block is not None:
            self._dispatch(entry, outcome.next_block)

    # ---- disaggregated handoff ----
    def _reserve_receiver(self, h: Handoff) -> None:
        h.dst = pick_decode_worker(self.loads(), h.pages)
        if h.dst is not None:
            self.workers[h.dst].reserved_pages += h.pages
            h.reserved = True

    def _unreserve(self, h: Handoff) -> None:
        if h.reserved:
            self.workers[h.dst].reserved_pages -= h.pages
            h.reserved = False

    def _current(self, request_id: str, block_index: int) -> tuple[Entry | None, Handoff | None]:
        entry = self.requests.get(request_id)
        h = entry.handoff if entry is not None else None
        return entry, h if h is not None and h.block_index == block_index else None

    def _on_prefill_done(self, entry: Entry, msg: PrefillDone) -> None:
        h = entry.handoff
        if h is None or h.block_index != msg.block_index:
            return
        h.steps = msg.num_steps
        entry.stalled_since = time.monotonic()
        if h.dst is None:                       # held on the prefill worker until a receiver has room
            self._send_held(entry)
        elif h.kv_ok is False:
            self._fall_back(entry)
        elif h.relayed:
            self._install(entry)

    def _send_held(self, entry: Entry) -> None:
        h = entry.handoff
        self._reserve_receiver(h)
        if h.dst is None:
            self.decode_ready.append(entry.state.request_id)
            return
        self.send(entry.worker, HandoffKV(entry.state.request_id, h.dst))

    def _relay(self, msg: KVSent) -> None:
        """The sender's group, in its order, to the receiver; ended requests are drained there."""
        kept = []                                # (entry, handoff) per item; None: drained there
        for rid, block in zip(msg.request_ids, msg.block_indices):
            entry, h = self._current(rid, block)
            kept.append((entry, h) if h is not None and h.dst == msg.dst_worker else None)
        if self.workers[msg.dst_worker].alive:
            self.send(msg.dst_worker, ReceiveKV(msg.src_worker, msg.request_ids, msg.block_indices,
                                                msg.canvas_lens, tuple(k is not None for k in kept), msg.tag_base))
        for entry, h in filter(None, kept):
            h.relayed = True
            if h.steps is not None:
                self._install(entry)

    def _install(self, entry: Entry) -> None:
        h = entry.handoff
        self.send(h.dst, InstallKV(dataclasses.replace(entry.state.submit_msg(), step_offset=h.steps)))
        if h.kv_ok:
            self._complete(entry)

    def _complete(self, entry: Entry) -> None:
        entry.worker, entry.handoff = entry.handoff.dst, None

    def _on_handoff_done(self, msg: HandoffDone) -> None:
        if msg.is_sender:
            self.counters.kv_transfer_bytes += msg.num_bytes
            self.counters.kv_transfer_seconds += msg.seconds
            return
        entry, h = self._current(msg.request_id, msg.block_index)
        if h is None or h.dst != msg.worker_id:
            return
        self._unreserve(h)                      # its load reports count the pages from now on
        h.kv_ok = msg.ok
        if not msg.ok:
            self.counters.kv_transfers_failed += 1
            if h.steps is not None:
                self._fall_back(entry)
        elif h.steps is not None:
            self._complete(entry)

    def _fall_back(self, entry: Entry) -> None:
        """The receiver refused (pages short): re-prefill the block anywhere, decoding it there."""
        steps = entry.handoff.steps
        entry.handoff, entry.worker, entry.stalled_since = None, None, None
        retry = dataclasses.replace(entry.state.submit_msg(), step_offset=steps, handoff=False, stream_to=None)
        self._dispatch(entry, retry, allow_any_role=True)

    def _retry_waiting(self) -> None:
        for _ in range(len(self.decode_ready)):
            entry = self.requests.get(self.decode_ready.popleft())
            if entry is not None and entry.handoff is not None and entry.handoff.dst is None:
                self._send_held(entry)
        for _ in range(len(self.pending)):
            entry = self.requests.get(self.pending.popleft())
            if entry is not None:
                self._dispatch(entry, entry.state.submit_msg())

    # ---- failures ----
    def on_worker_lost(self, worker_ids: list[int], reason: str) -> None:
        """Fail (never hang) every request whose block lives on a lost worker."""
        lost = set(worker_ids)
        for wid in lost:
            w = self.workers[wid]
            w.alive = w.ready = False
            w.report, w.reserved_pages, w.outstanding_prefill_tokens = None, 0, 0
        for entry in list(self.requests.values()):
            if {entry.worker, entry.decode_worker} & lost:
                entry.charged = None if entry.charged and entry.charged[0] in lost else entry.charged
                if entry.decode_worker in lost:
                    entry.handoff = None
                self._finish(entry, entry.state.finish(visible_text(entry.state, self.tokenizer),
                                                       finish_reason="error", error=reason), abort_worker=True)
