"""The simulator's stand-in for the KV transport: TorchTransport's methods, no data; worker/handoff.py's page
bookkeeping runs unchanged on top. ASSUMPTION: a sender's link carries one group at a time, in order (no
bandwidth sharing); a group completes once both ends are ready and its bytes have crossed."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..messages import KVSent, ReceiveKV
from ..worker.kv_transfer import SendItem, Transfer


@dataclass
class _Group:
    transfers: list = field(default_factory=list)   # both ends' Transfer records
    opened_at: float | None = None                   # the sender's forward (or send) started
    ready_at: float | None = None                    # the sender's data is all there
    streamed: bool = False
    posted_at: float | None = None
    num_bytes: int = 0
    done_at: float | None = None


class Fabric:
    """Every simulated KV link; `wake(worker, at)` asks for that worker's turn when its transfer completes."""

    def __init__(self, cost, clock: Callable[[], float], wake: Callable[[int, float], None],
                 degrees: list[int] | None = None):
        self.cost = cost
        self.degrees = degrees           # each worker's TP degree: rank pairs move their heads side by side
        self.clock = clock
        self.wake = wake
        self.groups: dict[tuple[int, int, int], _Group] = {}
        self.link_free_at: dict[int, float] = {}
        self.done: dict[int, list[Transfer]] = {}          # worker -> completed transfers, not yet polled
        self.done_at: dict[int, float] = {}
        self.bytes_moved = 0

    def group(self, key) -> _Group:
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group()
        return g

    def try_complete(self, key) -> None:
        g = self.groups[key]
        if g.ready_at is None or g.posted_at is None or g.done_at is not None:
            return
        src, dst, _ = key
        # p x d ranks: each rank's link carries its 1/p (sending) or 1/d (receiving) of the heads at once
        lanes = min(self.degrees[src], self.degrees[dst]) if self.degrees else 1
        xfer = self.cost.kv_transfer_s(g.num_bytes / lanes)
        if g.streamed:   # layers leave as they are computed: the last one after the forward
            start = max(g.posted_at, g.opened_at, self.link_free_at.get(src, 0.0))
            end = max(start + xfer, g.ready_at + xfer / max(1, self.cost.num_layers))
        else:
            start = max(g.posted_at, g.ready_at, self.link_free_at.get(src, 0.0))
            end = start + xfer
        g.done_at = self.link_free_at[src] = end
        self.bytes_moved += g.num_bytes
        del self.groups[key]
        for t in g.transfers:
            self.done.setdefault(src if t.is_sender else dst, []).append(t)
            self.done_at[id(t)] = end
        self.wake(src, end)
        self.wake(dst, end)


class SimTransport:
    """One worker's end of the fabric."""

    def __init__(self, worker_id: int, fabric: Fabric):
        self.worker_id = worker_id
        self.fabric = fabric
        self.clock = fabric.clock
        self._next_tag: dict[int, int] = {}
        self._open: list[tuple[int, int, int]] = []
        self._submitted: list[Transfer] = []

    @property
    def pending(self) -> bool:
        return bool(self._submitted)

    def open(self, items: list[SendItem]) -> list[KVSent]:
        by_dst: dict[int, list[SendItem]] = {}
        for it in items:
            by_dst.setdefault(it.dst, []).append(it)
        msgs, now = [], self.clock()
        for dst, group in by_dst.items():
            base = self._next_tag.get(dst, 0)
            self._next_tag[dst] = base + 1
            key = (self.worker_id, dst, base)
            g = self.fabric.group(key)
            g.opened_at = now
            for it in group:   # started_at: HandoffDone.seconds covers the forward too, as on the real path
                t = Transfer(it.request_id, it.block_index, dst, True, True, self.fabric.cost.kv_bytes(it.length), now)
                g.transfers.append(t)
                g.num_bytes += t.num_bytes
                self._submitted.append(t)
            self._open.append(key)
            msgs.append(KVSent(self.worker_id, dst, tuple(i.request_id for i in group),
                               tuple(i.block_index for i in group), tuple(i.length for i in group), base))
        return msgs

    def layer_done(self, kv) -> None:      # the simulated forward has no layers to report
        pass

    def close(self) -> None:
        """The forward ended; `flush` learns when (the simulator knows the forward's duration)."""

    def flush(self, ready_at: float, streamed: bool = True) -> None:
        for key in self._open:
            g = self.fabric.groups.get(key)
            if g is not None:
                g.ready_at, g.streamed = ready_at, streamed
                self.fabric.try_complete(key)
        self._open = []

    def send_now(self, items: list[SendItem]) -> list[KVSent]:
        msgs = self.open(items)
        self.flush(self.clock(), streamed=False)
        return msgs

    def post(self, msg: ReceiveKV, dests: list) -> None:
        key = (msg.src_worker, self.worker_id, msg.tag_base)
        g = self.fabric.group(key)
        now = self.clock()
        for rid, block, length, slots in zip(msg.request_ids, msg.block_indices, msg.canvas_lens, dests):
            t = Transfer(rid, block, msg.src_worker, False, slots is not None, self.fabric.cost.kv_bytes(length), now,
                         slots=slots)
            g.transfers.append(t)
            self._submitted.append(t)
        g.posted_at = now
        self.fabric.try_complete(key)

    def completed(self) -> list[Transfer]:
        done = self.fabric.done.get(self.worker_id)
        if not done:
            return []
        now = self.clock()
        at = self.fabric.done_at
        ready = [t for t in done if at[id(t)] <= now]
        if ready:
            ids = {id(t) for t in ready}
            self.fabric.done[self.worker_id] = [t for t in done if id(t) not in ids]
            self._submitted = [t for t in self._submitted if id(t) not in ids]
            for t in ready:
                del at[id(t)]
        return ready

    def install(self, t: Transfer) -> None:   # no staged data to move
        pass
