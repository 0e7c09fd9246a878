"""KV handoffs between tensor-parallel instances (docs/parallelism.md): a rank of degree d holds a contiguous 1/d of
the KV heads, so prefill rank i sends decode rank j the heads both hold, and nothing else. Pure: who pairs with whom,
and how a leader's sends and receives are written down for its followers (worker/tp_handoff.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Piece:
    """One rank pair's share of a block's KV: local head ranges [lo, hi) on this rank and on the peer."""
    peer: int                          # the peer's rank in the KV world
    mine: tuple[int, int]
    theirs: tuple[int, int]


def whole(peer: int, heads: int) -> Piece:
    return Piece(peer, (0, heads), (0, heads))


def head_span(kv_heads: int, degree: int, rank: int) -> tuple[int, int]:
    n = kv_heads // degree
    return rank * n, (rank + 1) * n


def world_ranks(degrees: list[int]) -> tuple[tuple[int, ...], ...]:
    """Every instance's ranks in the KV world, its leader first: instances in worker order, ranks in rank order."""
    out, start = [], 0
    for d in degrees:
        out.append(tuple(range(start, start + d)))
        start += d
    return tuple(out)


@dataclass(frozen=True, slots=True)
class KVWorld:
    """Who holds which heads: `ranks[w]` are worker w's world ranks; with degree 1 everywhere a worker's rank is its
    id and every piece is the whole block."""
    ranks: tuple[tuple[int, ...], ...]
    kv_heads: int

    def pieces(self, worker: int, rank: int, peer: int) -> list[Piece]:
        """What rank `rank` of `worker` exchanges with each rank of `peer`, in the peer's rank order (both ends
        compute the same pairs, so posting in this order matches)."""
        mine_lo, mine_hi = head_span(self.kv_heads, len(self.ranks[worker]), rank)
        out = []
        for j, peer_rank in enumerate(self.ranks[peer]):
            lo, hi = head_span(self.kv_heads, len(self.ranks[peer]), j)
            a, b = max(lo, mine_lo), min(hi, mine_hi)
            if a < b:
                out.append(Piece(peer_rank, (a - mine_lo, b - mine_lo), (a - lo, b - lo)))
        return out


# What a TP leader broadcasts to its followers over the plan group (worker/tp.py): a forward's plan, the end, and
# the KV handoff operations they mirror (worker/tp_handoff.py).
FORWARD, STOP, OPEN, CLOSE, SEND_NOW, RECEIVE, INSTALL = 1, 2, 3, 4, 5, 6, 7


def slots_code(slots) -> list[int]:
    if isinstance(slots, slice):
        return [slots.start]
    return [-1, *slots.tolist()]


def encode_sends(items: list, tag_bases: dict[int, int]) -> list[int]:
    """OPEN / SEND_NOW: per destination worker its tag base and its items' lengths and slots."""
    out = [len(tag_bases)]
    for dst, base in tag_bases.items():
        group = [it for it in items if it.dst == dst]
        out += [dst, base, len(group)]
        for it in group:
            out += [it.length, *slots_code(it.slots)]
    return out


def encode_receive(msg, dests: list) -> list[int]:
    """RECEIVE: the sending worker, the tag base, and per item its length and slots (-2: drained)."""
    out = [msg.src_worker, msg.tag_base, len(dests)]
    for length, slots in zip(msg.canvas_lens, dests):
        out += [length, *([-2] if slots is None else slots_code(slots))]
    return out
