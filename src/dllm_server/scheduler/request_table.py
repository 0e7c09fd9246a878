"""The front process's request table (every request in flight, how many have not started, which
wait for a worker with room) and what a client-facing caller holds of one request: its handle,
whose events are the visible text as it grows, denoising progress if asked for, and the final
output."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ..messages import ContinueBlock, ReviseBlock, StepDelta
from ..request.state import RequestState

@dataclass(slots=True)
class Entry:
    state: RequestState
    events: object                     # a StreamBuffer (put_nowait, await get); tests pass an asyncio.Queue
    stream: str
    arrived_at: float
    worker: int | None = None          # worker holding the current block
    charged: tuple[int, int] | None = None   # (worker, tokens) counted as outstanding prefill
    started: bool = False              # first step seen (no longer waiting)
    first_token_at: float | None = None
    first_step_at: float | None = None
    done: bool = False
    lease: object | None = None        # the BlockPolicy leased for the next block, if any


@dataclass(slots=True)
class RequestTable:
    entries: dict[str, Entry] = field(default_factory=dict)
    num_waiting: int = 0                               # admitted, no step seen yet
    pending: collections.deque = field(default_factory=collections.deque)   # no worker could take them yet
    leased: dict[str, Entry] = field(default_factory=dict)   # next block leased to the worker holding it

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(list(self.entries.values()))

    def get(self, request_id: str) -> Entry | None:
        return self.entries.get(request_id)

    def add(self, entry: Entry) -> None:
        self.entries[entry.state.request_id] = entry
        self.num_waiting += 1

    def started(self, entry: Entry) -> None:
        if not entry.started:
            entry.started = True
            self.num_waiting -= 1

    def set_lease(self, entry: Entry, then) -> None:
        entry.lease = then
        if then is None:
            self.leased.pop(entry.state.request_id, None)
        else:
            self.leased[entry.state.request_id] = entry

    def revision(self, request_id: str, block_index: int, policy) -> tuple[int, object] | None:
        """Where a re-decided block's policy goes, and as what: the block running (or queued) on
        the request's worker gets ReviseBlock; its leased next block a new ContinueBlock (the lease
        updated here). None when the request moved on or holds no such block."""
        entry = self.entries.get(request_id)
        if entry is None or entry.worker is None:
            return None
        k = entry.state.block_index
        if block_index == k:
            return entry.worker, ReviseBlock(request_id, k, policy)
        if block_index == k + 1 and request_id in self.leased:
            self.set_lease(entry, policy)
            return entry.worker, ContinueBlock(request_id, k, policy)
        return None

    def remove(self, entry: Entry) -> None:
        """Evict: memory stays bounded."""
        self.started(entry)
        self.set_lease(entry, None)
        entry.done = True
        self.entries.pop(entry.state.request_id, None)

