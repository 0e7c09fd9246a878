"""The handoff state machine of disaggregated / hybrid placement: a block's move from its prefill worker to a
decode worker. It turns worker messages into actions and never calls back into its owner. A move completes
when both PrefillDone and the receiver's HandoffDone(ok) are in; with layer-wise streaming either comes first."""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Union

from ..decoding.params import BlockPolicy
from ..messages import Abort, HandoffDone, HandoffKV, KVSent, PrefillDone, ReceiveKV
from .placement import pick_decode_worker
from .counters import Counters
from .worker_table import WorkerTable


@dataclass(slots=True)
class Handoff:
    block_index: int
    src: int
    pages: int
    policy: BlockPolicy
    dst: int | None = None             # None: no decode worker had room yet
    reserved: bool = False             # `pages` counted in dst's reserved_pages
    steps: int | None = None           # forwards the block took on the prefill worker
    relayed: bool = False              # dst has posted its receives
    kv_ok: bool | None = None


@dataclass(frozen=True, slots=True)
class Send:
    worker: int
    msg: object


@dataclass(frozen=True, slots=True)
class InstallBlock:
    """Send InstallKV (the block as of its prefill step, step_offset = steps) to dst."""
    request_id: str
    dst: int
    steps: int
    policy: BlockPolicy


@dataclass(frozen=True, slots=True)
class Moved:
    request_id: str
    dst: int


@dataclass(frozen=True, slots=True)
class FallBack:
    """The receiver refused (pages short): re-prefill the block anywhere."""
    request_id: str
    steps: int
    policy: BlockPolicy


Action = Union[Send, InstallBlock, Moved, FallBack]


class Handoffs:
    def __init__(self, workers: WorkerTable, layerwise: bool, clock: Callable[[], float],
                 counters: Counters | None = None):
        self.workers = workers
        self.layerwise = layerwise
        self.clock = clock
        self.active: dict[str, Handoff] = {}
        self.held: collections.deque[str] = collections.deque()
        self.stalled: dict[str, tuple[int, float]] = {}          # request -> (decode worker, PrefillDone at)
        self.counters = counters if counters is not None else Counters()

    def begin(self, request_id: str, block_index: int, src: int, pages: int, policy: BlockPolicy) -> int | None:
        """A prefill routed to `src` will hand its block over; returns the receiver to stream to layer-wise, or None."""
        h = self.active[request_id] = Handoff(block_index, src, pages, policy)
        if self.layerwise:
            self._reserve(h)
        return h.dst

    def dst(self, request_id: str) -> int | None:
        h = self.active.get(request_id)
        return h.dst if h is not None else None

    def _current(self, request_id: str, block_index: int) -> Handoff | None:
        h = self.active.get(request_id)
        return h if h is not None and h.block_index == block_index else None

    def _reserve(self, h: Handoff) -> None:
        h.dst = pick_decode_worker(self.workers.loads(), h.pages)
        if h.dst is not None:
            self.workers[h.dst].reserved_pages += h.pages
            h.reserved = True

    def _unreserve(self, h: Handoff) -> None:
        if h.reserved:
            self.workers[h.dst].reserved_pages -= h.pages
            h.reserved = False

    def on_prefill_done(self, rid: str, msg: PrefillDone) -> list[Action]:
        h = self._current(rid, msg.block_index)
        if h is None:
            return []
        h.steps = msg.num_steps
        self.stalled[rid] = (-1, self.clock())
        if h.dst is None:
            return self._send_held(rid, h)
        if h.kv_ok is False:
            return self._fall_back(rid, h)
        return self._install(rid, h) if h.relayed else []

    def on_kv_sent(self, msg: KVSent) -> list[Action]:
        """Relay the sender's group, in its order, to the receiver; ended requests are drained."""
        kept = []
        for rid, block in zip(msg.request_ids, msg.block_indices):
            h = self._current(rid, block)
            kept.append((rid, h) if h is not None and h.dst == msg.dst_worker else None)
        out: list[Action] = []
        if self.workers[msg.dst_worker].alive:
            out.append(Send(msg.dst_worker, ReceiveKV(msg.src_worker, msg.request_ids, msg.block_indices,
                                                      msg.canvas_lens, tuple(k is not None for k in kept),
                                                      msg.tag_base)))
        for rid, h in filter(None, kept):
            h.relayed = True
            if h.steps is not None:
                out += self._install(rid, h)
        return out

    def on_handoff_done(self, msg: HandoffDone) -> list[Action]:
        c = self.counters
        if msg.is_sender:
            c.kv_transfer_bytes += msg.num_bytes
            c.kv_transfer_seconds += msg.seconds
            return []
        h = self._current(msg.request_id, msg.block_index)
        if h is None or h.dst != msg.worker_id:
            return []
        self._unreserve(h)                      # its load reports count the pages from now on
        h.kv_ok = msg.ok
        if not msg.ok:
            c.kv_transfers_failed += 1
            return self._fall_back(msg.request_id, h) if h.steps is not None else []
        return self._complete(msg.request_id, h) if h.steps is not None else []

    def on_step(self, rid: str, wid: int) -> None:
        """The first step on the decode worker ends the handoff stall."""
        s = self.stalled.get(rid)
        if s is not None and s[0] == wid and rid not in self.active:
            self.counters.kv_handoffs += 1
            self.counters.kv_handoff_stall_seconds += self.clock() - s[1]
            del self.stalled[rid]

    def retry_held(self) -> list[Action]:
        out: list[Action] = []
        for _ in range(len(self.held)):
            rid = self.held.popleft()
            h = self.active.get(rid)
            if h is not None and h.dst is None:
                out += self._send_held(rid, h)
        return out

    def release(self, rid: str) -> list[Action]:
        """Drop the handoff of an ended block or request; a receiver that posted its receives gets Abort."""
        self.stalled.pop(rid, None)
        h = self.active.pop(rid, None)
        if h is None:
            return []
        self._unreserve(h)
        if h.dst is not None and h.relayed and h.kv_ok is not False and self.workers[h.dst].alive:
            return [Send(h.dst, Abort(rid))]
        return []

    def forget(self, rid: str) -> None:
        """The decode worker of this handoff is gone (its reservations went with it)."""
        self.active.pop(rid, None)
        self.stalled.pop(rid, None)

    def _send_held(self, rid: str, h: Handoff) -> list[Action]:
        self._reserve(h)
        if h.dst is None:
            self.held.append(rid)
            return []
        return [Send(h.src, HandoffKV(rid, h.dst))]

    def _install(self, rid: str, h: Handoff) -> list[Action]:
        out: list[Action] = [InstallBlock(rid, h.dst, h.steps, h.policy)]
        if h.kv_ok:
            out += self._complete(rid, h)
        return out

    def _complete(self, rid: str, h: Handoff) -> list[Action]:
        del self.active[rid]
        if rid in self.stalled:
            self.stalled[rid] = (h.dst, self.stalled[rid][1])
        return [Moved(rid, h.dst)]

    def _fall_back(self, rid: str, h: Handoff) -> list[Action]:
        del self.active[rid]
        self.stalled.pop(rid, None)
        return [FallBack(rid, h.steps, h.policy)]
