"""A tensor-parallel follower's KV handoffs: its leader tells it every send and receive over the plan group (the
operations of kv_shards), in the leader's order, and it moves its own heads (docs/parallelism.md)."""
from __future__ import annotations

import torch

from ..messages import ReceiveKV
from ..model.attention import LayerKV
from .kv_shards import CLOSE, INSTALL, OPEN, RECEIVE, SEND_NOW, KVWorld
from .kv_transfer import KVSender, SendItem, Transfer, Waiter, install_staging, post_receives


class _Reader:
    def __init__(self, v: list[int], device: torch.device):
        self.v, self.i, self.device = v, 0, device

    def take(self, n: int = 1) -> list[int]:
        out = self.v[self.i:self.i + n]
        self.i += n
        return out

    def one(self) -> int:
        return self.take()[0]

    def slots(self, length: int):
        first = self.one()
        if first == -2:
            return None
        if first >= 0:
            return slice(first, first + length)
        return torch.tensor(self.take(length), dtype=torch.int64, device=self.device)


class FollowerHandoffs:
    """A follower's sends and receives, told by its leader in the leader's order; it keeps no request state. Its
    sends are copies (the leader may free and reuse the pages once its own send is done) and its receives land in
    staging until the leader installs them (the leader may free the pages of an aborted block)."""

    def __init__(self, world: KVWorld, worker: int, rank: int, layers: list[LayerKV], device: torch.device):
        self.world, self.worker, self.rank = world, worker, rank
        self.layers = layers
        self.device = device
        self.waiter = Waiter(device)
        self.sender = KVSender(worker, layers, self.waiter,
                               route=lambda dst: world.pieces(worker, rank, dst), copy=True)
        self.receives: dict[int, Transfer] = {}
        self._next_receive = 0

    def handle(self, op: int, payload: list[int]) -> None:
        for t in self.waiter.completed():       # the finished ones' buffers go; a failed one breaks the instance
            if t.error is not None:
                raise RuntimeError(f"KV transfer with worker {t.peer} failed: {t.error}")
        if op in (OPEN, SEND_NOW):
            items, bases = self._sends(payload)
            self.sender.open(items, tag_bases=bases)
            if op == SEND_NOW:
                self.sender.close()
        elif op == CLOSE:
            self.sender.close()
        elif op == RECEIVE:
            r = _Reader(payload, self.device)
            src, base, n = r.take(3)
            lengths, dests = [], []
            for _ in range(n):
                lengths.append(r.one())
                dests.append(r.slots(lengths[-1]))
            msg = ReceiveKV(src, ("",) * n, (0,) * n, tuple(lengths), tuple(d is not None for d in dests), base)
            ts = post_receives(self.layers, self.waiter, msg, dests, self.world.pieces(self.worker, self.rank, src),
                               staged=True)
            for t in ts:
                if t.ok:
                    self.receives[self._next_receive] = t
                self._next_receive += 1
        elif op == INSTALL:
            for rid in payload:
                t = self.receives.pop(rid)
                t.finished.wait()
                if t.error is not None:
                    raise RuntimeError(f"KV transfer from worker {t.peer} failed: {t.error}")
                install_staging(self.layers, t)
        else:
            raise ValueError(f"tensor parallel: unknown plan operation {op}")

    def _sends(self, payload: list[int]) -> tuple[list[SendItem], dict[int, int]]:
        """The items of an OPEN or SEND_NOW and each destination's tag base (kv_shards.encode_sends)."""
        r = _Reader(payload, self.device)
        items, bases = [], {}
        for _ in range(r.one()):
            dst, bases[dst], n = r.take(3)
            for _ in range(n):
                length = r.one()
                items.append(SendItem("", 0, r.slots(length), length, dst))
        return items, bases
