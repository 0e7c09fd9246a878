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
from .kv_shards import CLOSE, INSTALL, OPEN, RECEIVE, SEND_NOW, Piece, encode_receive, encode_sends, whole

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
    staging: list[tuple[tuple[int, int], torch.Tensor]] = field(default_factory=list)  # (local heads, [L, 2, n, h, d])
    slots: torch.Tensor | slice | None = None
    error: str | None = None
    receive_id: int = -1           # a TP leader's receive, numbered in order: the INSTALL that names it to followers
    finished: threading.Event = field(default_factory=threading.Event)   # set by the waiter (a follower's INSTALL)


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
            t.finished.set()
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
    pieces: list[Piece]
    next_layer: int = 0


class KVSender:
    """The sending end. `close` also sends what a failed forward left unsent (the receiver posted every layer);
    the caller keeps the pages untouched until the waiter reports the transfer done. `route(dst)`: what this rank
    sends each rank of worker `dst` (kv_shards.KVWorld.pieces; default the whole block to rank `dst`); `copy`: send
    copies, never views of the pool (a TP follower, whose pages the leader may reuse before its send is done)."""

    def __init__(self, worker_id: int, layers: list[LayerKV], waiter: Waiter, route=None, copy: bool = False) -> None:
        self.worker_id = worker_id
        self.layers = layers
        self.waiter = waiter
        self.route = route or (lambda dst: [whole(dst, layers[0].k.shape[1])])
        self.copy = copy
        self._layer_of = {id(layer.k): i for i, layer in enumerate(layers)}
        self._next_tag: dict[int, int] = collections.defaultdict(int)
        self._groups: list[_Group] = []

    def open(self, items: list[SendItem], tag_bases: dict[int, int] | None = None) -> list[KVSent]:
        """`tag_bases`: each destination's first tag as the leader chose it (a follower); else this sender's own."""
        by_dst: dict[int, list[SendItem]] = {}
        for it in items:
            by_dst.setdefault(it.dst, []).append(it)
        msgs = []
        layers = len(self.layers)
        now = time.perf_counter()
        for dst, group in by_dst.items():
            if tag_bases is not None:
                base = tag_bases[dst]
            else:
                base = self._next_tag[dst]
                self._next_tag[dst] = (base + 2 * layers * len(group)) % TAG_SPACE
                if self._next_tag[dst] < base:       # wrapped: restart at 0 so no group straddles the end
                    base, self._next_tag[dst] = 0, 2 * layers * len(group)
            transfers = []
            for it in group:
                transfers.append(Transfer(it.request_id, it.block_index, dst, True, True,
                                          kv_bytes(self.layers, it.length), now))
            self._groups.append(_Group(dst, base, group, transfers, self.route(dst)))
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
                block = cache[it.slots]
                pooled = isinstance(it.slots, slice)      # a view of the pool (gathered slots are a copy already)
                for p in g.pieces:
                    data = block[:, p.mine[0]:p.mine[1]]
                    if self.copy and pooled:
                        data = data.clone(memory_format=torch.contiguous_format)
                    else:
                        data = data.contiguous()        # a view stays one where the piece is the whole block
                    t.buffers.append(data)
                    t.works.append(dist.isend(data, p.peer, tag=g.tag_base + 2 * (layer * n + j) + half))
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


def post_receives(layers: list[LayerKV], waiter: Waiter, msg: ReceiveKV, dests: list[torch.Tensor | slice | None],
                  pieces: list[Piece] | None = None, staged: bool = False) -> list[Transfer]:
    """Post one group's receives in the sender's order; where `dests[i]` is None the data is drained. `pieces`: what
    each sending rank holds of this rank's heads (default: all of them, from rank `msg.src_worker`). A block lands
    in its pages directly when one piece brings all of it into a contiguous run, else in staging (always, if
    `staged`) that install_staging copies in."""
    k0 = layers[0].k
    heads = k0.shape[1]
    pieces = pieces or [whole(msg.src_worker, heads)]
    n = len(msg.request_ids)
    now = time.perf_counter()
    transfers, targets = [], []
    for rid, block, length, slots in zip(msg.request_ids, msg.block_indices, msg.canvas_lens, dests):
        t = Transfer(rid, block, msg.src_worker, False, slots is not None, kv_bytes(layers, length), now,
                     slots=slots)
        direct = isinstance(slots, slice) and not staged and len(pieces) == 1 and pieces[0].mine == (0, heads)
        if direct:
            target = lambda i, h, p, sl=slots: (layers[i].k if h == 0 else layers[i].v)[sl]
        elif slots is not None:
            t.staging = [(p.mine, torch.empty((len(layers), 2, length, p.mine[1] - p.mine[0], k0.shape[2]),
                                              dtype=k0.dtype, device=k0.device)) for p in pieces]
            target = lambda i, h, p, st=t.staging: st[p][1][i, h]
        else:                   # drained: every layer into the same scratch
            bufs = [torch.zeros((2, length, p.mine[1] - p.mine[0], k0.shape[2]), dtype=k0.dtype, device=k0.device)
                    for p in pieces]
            target = lambda i, h, p, bufs=bufs: bufs[p][h]
        transfers.append(t)
        targets.append(target)
    for i in range(len(layers)):
        for j, (t, target) in enumerate(zip(transfers, targets)):
            for half in (0, 1):
                for p, piece in enumerate(pieces):
                    buf = target(i, half, p)
                    t.buffers.append(buf)
                    t.works.append(dist.irecv(buf, piece.peer, tag=msg.tag_base + 2 * (i * n + j) + half))
    for t in transfers:
        waiter.submit(t)
    return transfers


def install_staging(layers: list[LayerKV], t: Transfer) -> None:
    if t.slots is None:
        return
    for (lo, hi), staged in t.staging:
        for layer, kv in zip(layers, staged):
            layer.k[t.slots, lo:hi] = kv[0]
            layer.v[t.slots, lo:hi] = kv[1]


class TorchTransport:
    """The transport WorkerHandoffs drives; sim/transport.py is the simulator's stand-in with the same methods.
    `route(worker)`: this rank's pieces with each rank of that worker (kv_shards.KVWorld); `tell(op, payload)`: a
    tensor-parallel leader's line to its followers, who mirror every send and receive (worker/tp_handoff.py)."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, worker_id: int, layers: list[LayerKV], waiter: Waiter, route=None, tell=None,
                 kv_heads: int = 0) -> None:
        self.layers = layers
        self.waiter = waiter
        self.route = route
        self.tell = tell
        self.sender = KVSender(worker_id, layers, waiter, route=route)
        self._receives = 0
        # transfers report the whole instance's bytes (every rank moves its heads), as at TP 1
        self._instance_share = (kv_heads or layers[0].k.shape[1]) / layers[0].k.shape[1]

    @property
    def pending(self) -> bool:
        return bool(self.waiter.pending)

    def open(self, items: list[SendItem]) -> list[KVSent]:
        msgs = self.sender.open(items)
        self._tell_sends(OPEN, items, msgs)
        return msgs

    def layer_done(self, kv: LayerKV) -> None:
        self.sender.layer_done(kv)

    def close(self) -> None:
        self.sender.close()
        if self.tell is not None:
            self.tell(CLOSE, [])

    def send_now(self, items: list[SendItem]) -> list[KVSent]:
        msgs = self.sender.send_now(items)
        self._tell_sends(SEND_NOW, items, msgs)
        return msgs

    def _tell_sends(self, op: int, items: list[SendItem], msgs: list[KVSent]) -> None:
        if self.tell is not None:
            self.tell(op, encode_sends(items, {m.dst_worker: m.tag_base for m in msgs}))

    def post(self, msg: ReceiveKV, dests: list[torch.Tensor | slice | None]) -> None:
        if self.tell is not None:
            self.tell(RECEIVE, encode_receive(msg, dests))
        pieces = self.route(msg.src_worker) if self.route is not None else None
        for t in post_receives(self.layers, self.waiter, msg, dests, pieces):
            t.receive_id = self._receives
            self._receives += 1

    def completed(self) -> list[Transfer]:
        done = self.waiter.completed()
        for t in done:
            t.num_bytes = int(t.num_bytes * self._instance_share)
        return done

    def install(self, t: Transfer) -> None:
        install_staging(self.layers, t)
        if self.tell is not None:
            self.tell(INSTALL, [t.receive_id])


def connect_peers(rank: int, peers: list[int], device: torch.device) -> None:
    """Exchange a tensor with every KV peer at start-up: NCCL's first call per pair blocks both ends, so not inside a
    forward. Sorted pairs cannot deadlock: the smallest unfinished pair always has both ends waiting on it."""
    t = torch.zeros(1, device=device)
    for lo, hi in sorted((min(rank, p), max(rank, p)) for p in peers):
        if rank == lo:
            dist.send(t, hi)
        else:
            dist.recv(t, lo)
