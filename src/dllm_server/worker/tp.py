"""A tensor-parallel instance's ranks in step: the leader (rank 0, the worker the front knows)
sends every forward's plan to its followers, which run the same sharded forward on it.

The plan is what ModelRunner.forward needs of its items, as one int64 tensor: per item the canvas
length, fed and block ranges, its pages (or contiguous slot base) and the fed token ids, plus
whether the iteration is decode-only (the CUDA-graph path: every rank must take the same path).
Followers keep no request state: no canvas beyond the fed ids, no allocator, no sampling. A plan,
not a replay of the inbox: what the leader's admission decides depends on when messages arrive,
which would differ between ranks.

Transport: a broadcast over the instance's CPU (gloo) group, header then payload; on the GPU the
all-reduces run on a separate NCCL group. A STOP plan ends the followers' loop.
"""
from __future__ import annotations

import datetime
import logging
import os
from array import array
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .kv_pool import PageAlloc, alloc_of_pages
from .runner import ForwardItem

log = logging.getLogger(__name__)

FORWARD, STOP = 1, 2
HEADER = 4                       # opcode, payload length, decode_only, number of items
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
    """Join the instance's torch.distributed world (its own port: one instance's restart never
    touches another's); its store lives in rank 0's process, at `host`."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=size,
                            timeout=GROUP_TIMEOUT)
    plan = dist.new_group(backend="gloo", timeout=GROUP_TIMEOUT) if backend != "gloo" else dist.group.WORLD
    groups = TPGroups(rank, size, plan, dist.group.WORLD)
    warm = torch.zeros(1, device=device)
    groups.all_reduce(warm)          # communicators initialised before any capture or forward
    return groups


def encode(items: list[ForwardItem], decode_only: bool) -> torch.Tensor:
    body = array("q")
    for it in items:
        a = it.alloc
        body.extend((it.canvas.numel(), it.fed_start, it.fed_end, it.block_start, it.block_end, a.slot_base,
                     len(a.pages)))
        body.extend(a.pages)
        body.frombytes(it.canvas[it.fed_start:it.fed_end].numpy().tobytes())
    head = array("q", (FORWARD, len(body), int(decode_only), len(items)))
    return torch.frombuffer(head + body, dtype=torch.int64)


def decode(plan: torch.Tensor, mask_id: int, page_size: int, device: torch.device) -> tuple[list[ForwardItem], bool]:
    """The leader's items as a follower rebuilds them: the canvas holds only the fed ids (the rest
    is never read), the allocation the leader's pages."""
    v = plan.tolist()
    decode_only, n = bool(v[2]), v[3]
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
    return items, decode_only


class PlanSender:
    """The leader's side: ModelRunner calls it before every forward (ModelRunner.plan_sink)."""

    def __init__(self, groups: TPGroups):
        self.groups = groups

    def __call__(self, items: list[ForwardItem], decode_only: bool) -> None:
        plan = encode(items, decode_only)
        head = plan[:HEADER].clone()
        dist.broadcast(head, src=0, group=self.groups.plan)
        dist.broadcast(plan[HEADER:].clone(), src=0, group=self.groups.plan)

    def stop(self) -> None:
        with _quiet():
            dist.broadcast(torch.tensor([STOP, 0, 0, 0], dtype=torch.int64), src=0, group=self.groups.plan)


def follow(runner, groups: TPGroups, mask_id: int, page_size: int) -> int:
    """A follower's loop: receive a plan, run its forward (no logits), until STOP or the leader
    is gone (the broadcast raises). Returns the forwards run."""
    forwards = 0
    head = torch.zeros(HEADER, dtype=torch.int64)
    while True:
        dist.broadcast(head, src=0, group=groups.plan)
        op, length = int(head[0]), int(head[1])
        if op == STOP:
            return forwards
        body = torch.empty(length, dtype=torch.int64)
        dist.broadcast(body, src=0, group=groups.plan)
        items, decode_only = decode(torch.cat([head, body]), mask_id, page_size, runner.device)
        runner.forward(items, decode_only=decode_only, logits=False)
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


def gather_rss(tp: TPGroups | None) -> tuple[float, ...]:
    """Every rank's resident memory (MB) at the leader, in rank order (a follower gets ())."""
    mine = torch.tensor([rss_mb()], dtype=torch.float64)
    if tp is None:
        return (float(mine),)
    parts = [torch.zeros(1, dtype=torch.float64) for _ in range(tp.size)] if tp.rank == 0 else None
    dist.gather(mine, parts, dst=0, group=tp.plan)
    return tuple(float(p) for p in parts) if parts is not None else ()


def rss_mb() -> float:
    """This process's resident memory (Linux /proc), for the per-rank start-up log line."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0
