"""The worker side of KV handoffs: which pages a transfer reads or fills, and when they return to the pool.
Pages are never freed under a transfer: meanwhile they belong to a sending or receiving owner key. The transport
is injected (kv_transfer.TorchTransport, or sim/transport.py), so this bookkeeping is the same in the simulator."""
from __future__ import annotations

from dataclasses import dataclass

from ..messages import HandoffDone, KVSent, ReceiveKV, SubmitBlock
from .kv_pool import KVPool, PageAlloc
from .kv_transfer import SendItem, TorchTransport, Transfer


def sending_owner(request_id: str, block_index: int) -> str:
    """Pool owner key of pages being sent (the request's next block may allocate meanwhile)."""
    return f"{request_id}\x00out{block_index}"


def receiving_owner(request_id: str, block_index: int) -> str:
    return f"{request_id}\x00in{block_index}"


def slots_of(alloc: PageAlloc, length: int):
    """Pool slots of a block's first `length` canvas positions: a slice for a contiguous run."""
    if alloc.slot_ids is None:
        return slice(alloc.slot_base, alloc.slot_base + length)
    return alloc.slot_ids[:length]


@dataclass(slots=True)
class _Arrival:
    done: bool = False
    block: SubmitBlock | None = None
    aborted: bool = False


@dataclass(frozen=True, slots=True)
class Install:
    """A received block ready to decode: its KV sits on the pages of `owner` (a receiving owner)."""
    block: SubmitBlock
    owner: str


class WorkerHandoffs:
    def __init__(self, worker_id: int, pool: KVPool, transport: TorchTransport) -> None:
        self.worker_id = worker_id
        self.pool = pool
        self.transport = transport
        self.arrivals: dict[tuple[str, int], _Arrival] = {}

    @property
    def pending(self) -> bool:
        return self.transport.pending

    def open_streams(self, items: list[tuple[str, int, PageAlloc, int, int]]) -> list[KVSent]:
        """Open this forward's streamed sends; the KVSent messages must leave before the forward starts."""
        return self.transport.open([self._take(*it) for it in items])

    def layer_done(self, kv) -> None:
        self.transport.layer_done(kv)

    def close_streams(self) -> None:
        self.transport.close()

    def send_held(self, request_id: str, block_index: int, alloc: PageAlloc, length: int, dst: int) -> list[KVSent]:
        return self.transport.send_now([self._take(request_id, block_index, alloc, length, dst)])

    def _take(self, request_id: str, block_index: int, alloc: PageAlloc, length: int, dst: int) -> SendItem:
        self.pool.rename(request_id, sending_owner(request_id, block_index))
        return SendItem(request_id, block_index, slots_of(alloc, length), length, dst)

    def post(self, msg: ReceiveKV) -> None:
        dests = []
        for rid, block, length, keep in zip(msg.request_ids, msg.block_indices, msg.canvas_lens, msg.keep):
            alloc = None
            if keep and self.pool.can_allocate(length):
                alloc = self.pool.allocate(receiving_owner(rid, block), length)
                self.arrivals[(rid, block)] = _Arrival()
            dests.append(None if alloc is None else slots_of(alloc, length))
        self.transport.post(msg, dests)

    def install(self, block: SubmitBlock) -> list[Install]:
        a = self.arrivals.get((block.request_id, block.block_index))
        if a is None:                 # refused (the engine knows) or aborted meanwhile
            return []
        a.block = block
        return self._ready(block.request_id, block.block_index) if a.done else []

    def abort(self, request_id: str) -> None:
        for key in [k for k in self.arrivals if k[0] == request_id]:
            if self.arrivals[key].done:
                self._drop(*key)
            else:
                self.arrivals[key].aborted = True     # the pages stay until the peer's data is in

    def poll(self) -> tuple[list[HandoffDone], list[Install]]:
        """Finished transfers; a transport error is fatal to the worker (the group is broken)."""
        out, installs = [], []
        now = self.transport.clock()
        for t in self.transport.completed():
            if t.error is not None:
                raise RuntimeError(f"KV transfer with worker {t.peer} failed: {t.error}")
            if t.is_sender:
                self.pool.free(sending_owner(t.request_id, t.block_index))
            else:
                installs += self._received(t)
            out.append(HandoffDone(t.request_id, t.block_index, self.worker_id, t.is_sender, t.ok, t.num_bytes,
                                   now - t.started_at))
        return out, installs

    def _received(self, t: Transfer) -> list[Install]:
        a = self.arrivals.get((t.request_id, t.block_index))
        if a is None:
            return []
        a.done = True
        self.transport.install(t)
        if a.aborted:
            self._drop(t.request_id, t.block_index)
            return []
        return self._ready(t.request_id, t.block_index) if a.block is not None else []

    def _ready(self, request_id: str, block_index: int) -> list[Install]:
        a = self.arrivals.pop((request_id, block_index))
        return [Install(a.block, receiving_owner(request_id, block_index))]

    def _drop(self, request_id: str, block_index: int) -> None:
        del self.arrivals[(request_id, block_index)]
        self.pool.free(receiving_owner(request_id, block_index))
