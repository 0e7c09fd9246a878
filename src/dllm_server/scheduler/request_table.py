"""The front process's table of requests in flight: which have not started, which wait for a worker with room."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ..messages import ContinueBlock, ReviseBlock
from ..request.state import RequestState

@dataclass(slots=True)
class Entry:
    state: RequestState
    events: object                     # a StreamBuffer; tests pass an asyncio.Queue
    stream: str
    arrived_at: float
    worker: int | None = None          # worker holding the current block
    charged: tuple[int, int] | None = None   # (worker, tokens) counted as outstanding prefill
    started: bool = False
    first_token_at: float | None = None
    first_step_at: float | None = None
    done: bool = False
    lease: object | None = None        # the BlockPolicy leased for the next block
    policy: object | None = None       # the BlockPolicy its current block was last sent with
    yielded: bool = False              # moved back in line as late (deadline scheduling)
    resumes: int = 0                   # times its worker died under it and it was resumed elsewhere


@dataclass(slots=True)
class RequestTable:
    entries: dict[str, Entry] = field(default_factory=dict)
    num_waiting: int = 0                               # admitted, no step seen yet
    pending: collections.deque = field(default_factory=collections.deque)   # no worker could take them yet
    leased: dict[str, Entry] = field(default_factory=dict)

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
        """(worker, ReviseBlock for the current block or ContinueBlock for the leased next one), or None."""
        entry = self.entries.get(request_id)
        if entry is None or entry.worker is None:
            return None
        k = entry.state.block_index
        if block_index == k:
            entry.policy = policy
            return entry.worker, ReviseBlock(request_id, k, policy)
        if block_index == k + 1 and request_id in self.leased:
            self.set_lease(entry, policy)
            return entry.worker, ContinueBlock(request_id, k, policy)
        return None

    def remove(self, entry: Entry) -> None:
        self.started(entry)
        self.set_lease(entry, None)
        entry.done = True
        self.entries.pop(entry.state.request_id, None)

