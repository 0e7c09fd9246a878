"""A tensor-parallel instance's ranks in step (docs/parallelism.md): the leader (rank 0) broadcasts every forward's
plan over the instance's gloo group, and followers, which keep no request state, run the same sharded forward.
A plan, not a replay of the inbox: admission depends on when messages arrive, which differs between ranks."""
from __future__ import annotations

import datetime
import logging
import os
from array import array
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .kv_pool import PageAlloc, alloc_of_pages
from .kv_shards import FORWARD, STOP
from .runner import ForwardItem

log = logging.getLogger(__name__)

HEADER = 4                       # opcode, payload length, flags, number of items
DECODE_ONLY, STREAMS = 1, 2      # flags of a FORWARD: the leader streams KV from this forward (tp_handoff.py)
GROUP_TIMEOUT = datetime.timedelta(days=7)   # an idle follower waits in a broadcast: no spurious timeout


@dataclass(frozen=True, slots=True)
class TPGroups:
    """The instance's process groups: `plan` (gloo, host tensors) and `reduce` (the device's)."""
    rank: int
    size: int
    plan: object
    reduce: object

    def all_reduce(self, t: torch.Tensor) -> None:
        dist.all_reduce(t, group=self.reduce)


def init_groups(rank: int, size: int, host: str, port: int, device: torch.device) -> TPGroups:
    """Join the instance's own torch.distributed world (own port: restarts stay independent); rank 0 hosts the store."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=size,
                            timeout=GROUP_TIMEOUT)
    plan = dist.new_group(backend="gloo", timeout=GROUP_TIMEOUT) if backend != "gloo" else dist.group.WORLD
    return _warm(TPGroups(rank, size, plan, dist.group.WORLD), device)


def subgroups(instances: tuple[tuple[int, ...], ...], mine: int, rank: int, device: torch.device) -> TPGroups | None:
    """Inside a KV world that already holds every rank of every instance (disaggregated and hybrid placement): each
    instance's groups, created by every process in the same order as new_group requires; this process's or None."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    groups = None
    for w, ranks in enumerate(instances):
        if len(ranks) == 1:
            continue
        reduce = dist.new_group(list(ranks), timeout=GROUP_TIMEOUT, backend=backend)
        plan = dist.new_group(list(ranks), timeout=GROUP_TIMEOUT, backend="gloo") if backend != "gloo" else reduce
        if w == mine:
            groups = TPGroups(rank, len(ranks), plan, reduce)
    return _warm(groups, device) if groups is not None else None


def _warm(groups: TPGroups, device: torch.device) -> TPGroups:
    warm = torch.zeros(1, device=device)
    groups.all_reduce(warm)          # communicators initialised before any capture or forward
    return groups


def encode(items: list[ForwardItem], decode_only: bool, streams: bool = False) -> torch.Tensor:
    body = array("q")
    for it in items:
        a = it.alloc
        body.extend((it.canvas.numel(), it.fed_start, it.fed_end, it.block_start, it.block_end, a.slot_base,
                     len(a.pages)))
        body.extend(a.pages)
        body.frombytes(it.canvas[it.fed_start:it.fed_end].numpy().tobytes())
    head = array("q", (FORWARD, len(body), DECODE_ONLY * decode_only | STREAMS * streams, len(items)))
    return torch.frombuffer(head + body, dtype=torch.int64)


def decode(plan: torch.Tensor, mask_id: int, page_size: int, device: torch.device
           ) -> tuple[list[ForwardItem], bool, bool]:
    """The leader's items as a follower rebuilds them (only the fed ids of the canvas are real: the rest is unread),
    whether it is decode-only and whether it streams KV."""
    v = plan.tolist()
    decode_only, streams, n = bool(v[2] & DECODE_ONLY), bool(v[2] & STREAMS), v[3]
    i, items = HEADER, []
    for _ in range(n):
        canvas_len, fed_start, fed_end, block_start, block_end, slot_base, n_pages = v[i:i + 7]
        i += 7
        pages = v[i:i + n_pages]
        i += n_pages
        canvas = torch.full((canvas_len,), mask_id, dtype=torch.int64)
        canvas[fed_start:fed_end] = plan[i:i + fed_end - fed_start]
        i += fed_end - fed_start
        alloc = PageAlloc(pages, slot_base, None) if slot_base >= 0 else alloc_of_pages(pages, canvas_len, page_size,
                                                                                        device)
        items.append(ForwardItem(canvas, alloc, fed_start, fed_end, block_start, block_end))
    return items, decode_only, streams


class PlanSender:
    """The leader's side: ModelRunner calls it before every forward (ModelRunner.plan_sink)."""

    def __init__(self, groups: TPGroups):
        self.groups = groups

    def __call__(self, items: list[ForwardItem], decode_only: bool, streams: bool = False) -> None:
        plan = encode(items, decode_only, streams)
        dist.broadcast(plan[:HEADER].clone(), group=self.groups.plan, group_src=0)
        if plan.numel() > HEADER:
            dist.broadcast(plan[HEADER:].clone(), group=self.groups.plan, group_src=0)

    def tell(self, op: int, payload: list[int]) -> None:
        """A KV handoff operation for the followers to mirror (kv_shards: OPEN ... INSTALL)."""
        dist.broadcast(torch.tensor([op, len(payload), 0, 0], dtype=torch.int64), group=self.groups.plan, group_src=0)
        if payload:
            dist.broadcast(torch.tensor(payload, dtype=torch.int64), group=self.groups.plan, group_src=0)

    def stop(self) -> None:
        with _quiet():
            dist.broadcast(torch.tensor([STOP, 0, 0, 0], dtype=torch.int64), group=self.groups.plan, group_src=0)


def follow(runner, groups: TPGroups, mask_id: int, page_size: int, handoffs=None) -> int:
    """A follower's loop until STOP or the leader is gone (the broadcast raises); returns the forwards run.
    `handoffs` (tp_handoff.FollowerHandoffs): the instance hands KV to or from others, so plans also carry those."""
    forwards = 0
    head = torch.zeros(HEADER, dtype=torch.int64)
    while True:
        dist.broadcast(head, group=groups.plan, group_src=0)
        op, length = int(head[0]), int(head[1])
        if op == STOP:
            return forwards
        body = torch.empty(length, dtype=torch.int64)
        if length:
            dist.broadcast(body, group=groups.plan, group_src=0)
        if op != FORWARD:
            handoffs.handle(op, body.tolist())
            continue
        items, decode_only, streams = decode(torch.cat([head, body]), mask_id, page_size, runner.device)
        layer_done = handoffs.sender.layer_done if streams else None
        runner.forward(items, layer_done=layer_done, decode_only=decode_only, logits=False)
        forwards += 1


class _quiet:
    """A STOP to followers that are already gone must not turn a clean exit into a crash."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is not None and isinstance(exc, Exception):
            log.debug("tensor parallel: STOP not delivered (%s)", exc)
            return True
        return False


def gather_rss(tp: TPGroups | None, weights_mb: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Every rank's resident memory and the part loading its weights added (MB), at the leader, in rank order
    (a follower gets empty tuples)."""
    mine = torch.tensor([rss_mb(), weights_mb], dtype=torch.float64)
    if tp is None:
        return (float(mine[0]),), (float(mine[1]),)
    parts = [torch.zeros(2, dtype=torch.float64) for _ in range(tp.size)] if tp.rank == 0 else None
    dist.gather(mine, parts, group=tp.plan, group_dst=0)
    if parts is None:
        return (), ()
    return tuple(float(p[0]) for p in parts), tuple(float(p[1]) for p in parts)


def rss_mb(anonymous: bool = False) -> float:
    """Resident memory (MB); `anonymous`: without file-backed pages (a checkpoint's mapped, evictable pages)."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            fields = f.read().split()
        pages = int(fields[1]) - (int(fields[2]) if anonymous else 0)
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0
