"""KV handoff transport over torch.distributed point-to-point; it never allocates or frees pages (worker/handoff.py
does). Order, not locks, keeps it deadlock-free: the sender fixes its send order and announces each group (KVSent)
before its data, and the receiver posts its receives in that order from its FIFO inbox (NCCL matches by order,
gloo by tag). Nothing blocks the worker loop: a waiter thread waits on the works."""
from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..messages import KVSent, ReceiveKV
from ..model.attention import LayerKV

TAG_SPACE = 1 << 30          # gloo tags are 32-bit; tag bases wrap inside this


def kv_bytes(layers: list[LayerKV], length: int) -> int:
    k = layers[0].k
    return 2 * len(layers) * length * k.shape[1] * k.shape[2] * k.element_size()


@dataclass(slots=True)
class Transfer:
    request_id: str
    block_index: int
    peer: int
    is_sender: bool
    ok: bool                       # receiver: it had pages, else the data was drained
    num_bytes: int
    started_at: float
    works: list = field(default_factory=list)
    buffers: list = field(default_factory=list)   # tensors the works read or write: kept alive
    staging: torch.Tensor | None = None
    slots: torch.Tensor | slice | None = None
    error: str | None = None


class Waiter:
    """Waits on transfers' works on a background thread, in submission order: gloo reports completion only through
    a blocking wait, and NCCL's wait() only orders streams, so on CUDA it synchronises a private stream."""

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
            except Exception as exc:
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
    slots: torch.Tensor | slice
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
    """The sending end. `close` also sends what a failed forward left unsent (the receiver posted every layer);
    the caller keeps the pages untouched until the waiter reports the transfer done."""

    def __init__(self, worker_id: int, layers: list[LayerKV], waiter: Waiter) -> None:
        self.worker_id = worker_id
        self.layers = layers
        self.waiter = waiter
        self._layer_of = {id(layer.k): i for i, layer in enumerate(layers)}
        self._next_tag: dict[int, int] = collections.defaultdict(int)
        self._groups: list[_Group] = []

    def open(self, items: list[SendItem]) -> list[KVSent]:
        by_dst: dict[int, list[SendItem]] = {}
        for it in items:
            by_dst.setdefault(it.dst, []).append(it)
        msgs = []
        layers = len(self.layers)
        now = time.perf_counter()
        for dst, group in by_dst.items():
            base = self._next_tag[dst]
            self._next_tag[dst] = (base + 2 * layers * len(group)) % TAG_SPACE
            if self._next_tag[dst] < base:       # wrapped: restart at 0 so no group straddles the end
                base, self._next_tag[dst] = 0, 2 * layers * len(group)
            transfers = []
            for it in group:
                transfers.append(Transfer(it.request_id, it.block_index, dst, True, True,
                                          kv_bytes(self.layers, it.length), now))
            self._groups.append(_Group(dst, base, group, transfers))
            msgs.append(KVSent(self.worker_id, dst, tuple(i.request_id for i in group),
                               tuple(i.block_index for i in group), tuple(i.length for i in group), base))
        return msgs

    def layer_done(self, kv: LayerKV) -> None:
        """Attention's hook after layer `kv`: that layer of every open group can go."""
        i = self._layer_of[id(kv.k)]
        for g in self._groups:
            if g.next_layer == i:
                self._send_layer(g, i)

    def _send_layer(self, g: _Group, layer: int) -> None:
        kv = self.layers[layer]
        n = len(g.items)
        for j, (it, t) in enumerate(zip(g.items, g.transfers)):
            for half, cache in enumerate((kv.k, kv.v)):
                data = cache[it.slots]
                t.buffers.append(data)
                t.works.append(dist.isend(data, g.dst, tag=g.tag_base + 2 * (layer * n + j) + half))
        g.next_layer = layer + 1

    def close(self) -> None:
        for g in self._groups:
            for layer in range(g.next_layer, len(self.layers)):
                self._send_layer(g, layer)
            for t in g.transfers:
                self.waiter.submit(t)
        self._groups = []

    def send_now(self, items: list[SendItem]) -> list[KVSent]:
        msgs = self.open(items)
        self.close()
        return msgs


def post_receives(layers: list[LayerKV], waiter: Waiter, msg: ReceiveKV,
                  dests: list[torch.Tensor | slice | None]) -> list[Transfer]:
    """Post one group's receives in the sender's order; where `dests[i]` is None the data is drained."""
    k0 = layers[0].k
    n = len(msg.request_ids)
    now = time.perf_counter()
    transfers, targets = [], []
    for rid, block, length, slots in zip(msg.request_ids, msg.block_indices, msg.canvas_lens, dests):
        t = Transfer(rid, block, msg.src_worker, False, slots is not None, kv_bytes(layers, length), now,
                     slots=slots)
        shape = (length, k0.shape[1], k0.shape[2])
        if isinstance(slots, slice):
            target = lambda i, h, sl=slots: (layers[i].k if h == 0 else layers[i].v)[sl]
        elif slots is not None:
            t.staging = torch.empty((len(layers), 2) + shape, dtype=k0.dtype, device=k0.device)
            target = lambda i, h, s=t.staging: s[i, h]
        else:
            scratch = torch.zeros((2,) + shape, dtype=k0.dtype, device=k0.device)
            target = lambda i, h, s=scratch: s[h]
        transfers.append(t)
        targets.append(target)
    for i in range(len(layers)):
        for j, (t, target) in enumerate(zip(transfers, targets)):
            for half in (0, 1):
                buf = target(i, half)
                t.buffers.append(buf)
                t.works.append(dist.irecv(buf, msg.src_worker, tag=msg.tag_base + 2 * (i * n + j) + half))
    for t in transfers:
        waiter.submit(t)
    return transfers


def install_staging(layers: list[LayerKV], t: Transfer) -> None:
    if t.staging is None or t.slots is None:
        return
    for layer, kv in zip(layers, t.staging):
        layer.k[t.slots] = kv[0]
        layer.v[t.slots] = kv[1]


class TorchTransport:
    """The transport WorkerHandoffs drives; sim/transport.py is the simulator's stand-in with the same methods."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, worker_id: int, layers: list[LayerKV], waiter: Waiter) -> None:
        self.layers = layers
        self.waiter = waiter
        self.sender = KVSender(worker_id, layers, waiter)

    @property
    def pending(self) -> bool:
        return bool(self.waiter.pending)

    def open(self, items: list[SendItem]) -> list[KVSent]:
        return self.sender.open(items)

    def layer_done(self, kv: LayerKV) -> None:
        self.sender.layer_done(kv)

    def close(self) -> None:
        self.sender.close()

    def send_now(self, items: list[SendItem]) -> list[KVSent]:
        return self.sender.send_now(items)

    def post(self, msg: ReceiveKV, dests: list[torch.Tensor | slice | None]) -> None:
        post_receives(self.layers, self.waiter, msg, dests)

    def completed(self) -> list[Transfer]:
        return self.waiter.completed()

    def install(self, t: Transfer) -> None:
        install_staging(self.layers, t)


def connect_peers(rank: int, peers: list[int], device: torch.device) -> None:
    """Exchange a tensor with every KV peer at start-up: NCCL's first call per pair blocks both ends, so not inside a
    forward. Sorted pairs cannot deadlock: the smallest unfinished pair always has both ends waiting on it."""
    t = torch.zeros(1, device=device)
    for lo, hi in sorted((min(rank, p), max(rank, p)) for p in peers):
        if rank == lo:
            dist.send(t, hi)
        else:
            dist.recv(t, lo)
