"""KV handoff between workers with torch.distributed point-to-point (NCCL on GPU, gloo on CPU).

A *group* is what one sender sends one receiver at once: for each layer, for each request in
order, its K then its V, each a run of pool slots sent straight from the pool (a gathered copy
when the pages are not contiguous). A prefill worker sends a streamed group from inside the
forward, right after each layer's attention (`KVSender.layer_done`), so layer i travels while
layer i + 1 computes; a block held for a later HandoffKV is sent whole.

Order, not locks, keeps this deadlock-free: the sender fixes the order of its sends and announces
each group (KVSent) before its data flows; the engine relays it (ReceiveKV) on the receiver's
FIFO inbox, and the receiver posts its receives in that order. NCCL matches sends and receives
per pair by order, gloo by tag; both hold. Nothing here blocks the worker loop: isend / irecv
return at once, and a waiter thread waits on the works and reports finished transfers.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..messages import KVSent, ReceiveKV, SubmitBlock
from ..model.attention import LayerKV
from .kv_pool import KVPool, PageAlloc

if TYPE_CHECKING:
    from .core import WorkerCore

TAG_SPACE = 1 << 30          # gloo tags are 32-bit; tag bases wrap inside this


def sending_owner(request_id: str, block_index: int) -> str:
    """Pool owner key of pages being sent (the request's next block may allocate meanwhile)."""
    return f"{request_id}\x00out{block_index}"


def receiving_owner(request_id: str, block_index: int) -> str:
    return f"{request_id}\x00in{block_index}"


def _slots(alloc: PageAlloc, length: int) -> torch.Tensor | slice:
    if alloc.slot_ids is None:
        return slice(alloc.slot_base, alloc.slot_base + length)
    return alloc.slot_ids[:length]


def kv_bytes(pool: KVPool, length: int) -> int:
    k = pool.layers[0].k
    return 2 * len(pool.layers) * length * k.shape[1] * k.shape[2] * k.element_size()


@dataclass(slots=True)
class Transfer:
    request_id: str
    block_index: int
    peer: int
    is_sender: bool
    ok: bool                       # receiver: it had pages (otherwise the data was drained)
    num_bytes: int
    started_at: float
    works: list = field(default_factory=list)
    buffers: list = field(default_factory=list)   # tensors the works read or write: kept alive
    staging: torch.Tensor | None = None   # receiver, gathered pages: [layers, 2, len, kv_heads, head_dim]
    alloc: PageAlloc | None = None
    error: str | None = None


class Waiter:
    """Waits on transfers' works on a background thread, in submission order (gloo's works only
    report completion through a blocking wait; NCCL's wait() only orders streams, so on CUDA the
    thread waits on a private stream and synchronises it)."""

    def __init__(self, device: torch.device) -> None:
        self.pending: list[Transfer] = []
        self._jobs: queue.Queue[Transfer] = queue.Queue()
        self._done: queue.Queue[Transfer] = queue.Queue()
        threading.Thread(target=self._run, args=(device,), name="kv-transfer", daemon=True).start()

    def submit(self, t: Transfer) -> None:
        self.pending.append(t)
        self._jobs.put(t)

    def _run(self, device: torch.device) -> None:
        stream = None
        if device.type == "cuda":
            torch.cuda.set_device(device)          # the current device is per thread
            stream = torch.cuda.Stream(device)
        while True:
            t = self._jobs.get()
            try:
                if stream is None:
                    for w in t.works:
                        w.wait()
                else:
                    with torch.cuda.stream(stream):
                        for w in t.works:
                            w.wait()
                    stream.synchronize()
            except Exception as exc:   # surfaced by completed(); the worker then fails
                t.error = f"{type(exc).__name__}: {exc}"
            self._done.put(t)

    def completed(self) -> list[Transfer]:
        done = []
        while True:
            try:
                done.append(self._done.get_nowait())
            except queue.Empty:
                break
        if done:
            ids = {id(t) for t in done}
            self.pending = [t for t in self.pending if id(t) not in ids]
        return done


@dataclass(slots=True)
class SendItem:
    request_id: str
    block_index: int
    alloc: PageAlloc
    length: int
    dst: int


@dataclass(slots=True)
class _Group:
    dst: int
    tag_base: int
    items: list[SendItem]
    transfers: list[Transfer]
    next_layer: int = 0


class KVSender:
    """The sending end. `open` takes the pages over (renamed to a sending owner, freed by the
    caller when the transfer completes), fixes the groups and returns their KVSent messages;
    `layer_done` is the forward's per-layer hook; `close` sends what a failed forward left
    unsent (the receiver has posted for every layer) and hands the transfers to the waiter."""

    def __init__(self, worker_id: int, pool: KVPool, waiter: Waiter) -> None:
        self.worker_id = worker_id
        self.pool = pool
        self.waiter = waiter
        self._layer_of = {id(layer.k): i for i, layer in enumerate(pool.layers)}
        self._next_tag: dict[int, int] = collections.defaultdict(int)
        self._groups: list[_Group] = []

    @property
    def is_open(self) -> bool:
        return bool(self._groups)

    def open(self, items: list[SendItem]) -> list[KVSent]:
        by_dst: dict[int, list[SendItem]] = {}
        for it in items:
            by_dst.setdefault(it.dst, []).append(it)
        msgs = []
        layers = len(self.pool.layers)
        now = time.perf_counter()
        for dst, group in by_dst.items():
            base = self._next_tag[dst]
            self._next_tag[dst] = (base + 2 * layers * len(group)) % TAG_SPACE
            if self._next_tag[dst] < base:       # wrapped: restart at 0 so no group straddles the end
                base, self._next_tag[dst] = 0, 2 * layers * len(group)
            transfers = []
            for it in group:
                self.pool.rename(it.request_id, sending_owner(it.request_id, it.block_index))
                transfers.append(Transfer(it.request_id, it.block_index, dst, True, True,
                                          kv_bytes(self.pool, it.length), now))
            self._groups.append(_Group(dst, base, group, transfers))
            msgs.append(KVSent(self.worker_id, dst, tuple(i.request_id for i in group),
                               tuple(i.block_index for i in group), tuple(i.length for i in group), base))
        return msgs

    def layer_done(self, kv: LayerKV) -> None:
        """Called by attention after layer `kv` of the forward: its K/V of every fed token are in
        the pool, so this layer of every open group can go."""
        i = self._layer_of[id(kv.k)]
        for g in self._groups:
            if g.next_layer == i:
                self._send_layer(g, i)

    def _send_layer(self, g: _Group, layer: int) -> None:
        kv = self.pool.layers[layer]
        n = len(g.items)
        for j, (it, t) in enumerate(zip(g.items, g.transfers)):
            idx = _slots(it.alloc, it.length)
            for half, cache in enumerate((kv.k, kv.v)):
                data = cache[idx]                       # a view for contiguous pages
                t.buffers.append(data)
                t.works.append(dist.isend(data, g.dst, tag=g.tag_base + 2 * (layer * n + j) + half))
        g.next_layer = layer + 1

    def close(self) -> None:
        for g in self._groups:
            for layer in range(g.next_layer, len(self.pool.layers)):
                self._send_layer(g, layer)
            for t in g.transfers:
                self.waiter.submit(t)
        self._groups = []

    def send_now(self, items: list[SendItem]) -> list[KVSent]:
        msgs = self.open(items)
        self.close()
        return msgs


def post_receives(pool: KVPool, waiter: Waiter, msg: ReceiveKV, allocs: list[PageAlloc | None]) -> None:
    """The receiving end of one group: irecv every layer of every request, in the sender's order,
    straight into contiguous reserved pages, into a staging buffer for gathered pages, into a
    scratch buffer for requests that were refused (no pages) or have ended."""
    k0 = pool.layers[0].k
    layers, n = len(pool.layers), len(msg.request_ids)
    now = time.perf_counter()
    transfers, dests = [], []
    for rid, block, length, alloc in zip(msg.request_ids, msg.block_indices, msg.canvas_lens, allocs):
        t = Transfer(rid, block, msg.src_worker, False, alloc is not None, kv_bytes(pool, length), now, alloc=alloc)
        shape = (length, k0.shape[1], k0.shape[2])
        if alloc is not None and alloc.slot_ids is None:
            lo = alloc.slot_base
            dest = lambda i, h, lo=lo, length=length: (pool.layers[i].k if h == 0 else pool.layers[i].v)[lo: lo + length]
        elif alloc is not None:
            t.staging = torch.empty((layers, 2) + shape, dtype=k0.dtype, device=k0.device)
            dest = lambda i, h, s=t.staging: s[i, h]
        else:                                            # drained: one scratch pair reused per layer
            scratch = torch.zeros((2,) + shape, dtype=k0.dtype, device=k0.device)
            dest = lambda i, h, s=scratch: s[h]
        transfers.append(t)
        dests.append(dest)
    for i in range(layers):
        for j, (t, dest) in enumerate(zip(transfers, dests)):
            for half in (0, 1):
                buf = dest(i, half)
                t.buffers.append(buf)
                t.works.append(dist.irecv(buf, msg.src_worker, tag=msg.tag_base + 2 * (i * n + j) + half))
    for t in transfers:
        waiter.submit(t)


def install_staging(pool: KVPool, t: Transfer) -> None:
    """After a completed receive into gathered pages: move the staged K/V into their slots."""
    if t.staging is None or t.alloc is None:
        return
    idx = _slots(t.alloc, t.staging.shape[2])
    for layer, kv in zip(pool.layers, t.staging):
        layer.k[idx] = kv[0]
        layer.v[idx] = kv[1]


@dataclass(slots=True)
class _Arrival:
    done: bool = False                   # the data is in
    block: SubmitBlock | None = None     # InstallKV: the block to decode
    aborted: bool = False


class KVReceiver:
    """The receiving end on a decode worker: per (request, block), reserved pages until both the
    data (transfer done) and the block (InstallKV) are in; an Abort frees them once the data is
    in. Refused (no pages) and dropped (request ended) transfers reserve nothing."""

    def __init__(self, core: WorkerCore, waiter: Waiter) -> None:
        self.core, self.waiter = core, waiter
        self.arrivals: dict[tuple[str, int], _Arrival] = {}

    def post(self, msg: ReceiveKV) -> None:
        allocs = []
        for rid, block, length, keep in zip(msg.request_ids, msg.block_indices, msg.canvas_lens, msg.keep):
            alloc = self.core.reserve_received(rid, block, length) if keep else None
            allocs.append(alloc)
            if alloc is not None:
                self.arrivals[(rid, block)] = _Arrival()
        post_receives(self.core.pool, self.waiter, msg, allocs)

    def received(self, t: Transfer) -> None:
        a = self.arrivals.get((t.request_id, t.block_index))
        if a is None:
            return
        a.done = True
        install_staging(self.core.pool, t)
        if a.aborted:
            self._drop(t.request_id, t.block_index)
        elif a.block is not None:
            self._install(a.block)

    def install(self, block: SubmitBlock) -> None:
        a = self.arrivals.get((block.request_id, block.block_index))
        if a is None:                 # refused (the engine knows) or aborted meanwhile
            return
        a.block = block
        if a.done:
            self._install(block)

    def abort(self, request_id: str) -> None:
        for key in [k for k in self.arrivals if k[0] == request_id]:
            if self.arrivals[key].done:
                self._drop(*key)
            else:
                self.arrivals[key].aborted = True     # the pages stay until the peer's data is in

    def _install(self, block: SubmitBlock) -> None:
        del self.arrivals[(block.request_id, block.block_index)]
        if not self.core.install_received(block):
            self.core.pool.free(receiving_owner(block.request_id, block.block_index))

    def _drop(self, request_id: str, block_index: int) -> None:
        del self.arrivals[(request_id, block_index)]
        self.core.pool.free(receiving_owner(request_id, block_index))


def connect_peers(rank: int, peers: list[int], device: torch.device) -> None:
    """Exchange one tiny tensor with every KV peer, in sorted pair order, at start-up. NCCL builds a
    pair's communicator on its first point-to-point call, and that blocks both ends: it must not
    happen first inside a forward. Sorted pairs cannot deadlock: the smallest unfinished pair
    always has both ends waiting on it."""
    t = torch.zeros(1, device=device)
    for lo, hi in sorted((min(rank, p), max(rank, p)) for p in peers):
        if rank == lo:
            dist.send(t, hi)
        else:
            dist.recv(t, lo)
