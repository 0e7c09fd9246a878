"""The front process's table of workers: role, liveness, load report, pages promised to handoffs, prefill
tokens routed but not started. Plain state; sends no messages."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import WorkerPolicy
from ..messages import LoadReport, ModelInfo, RowInvariance, SetPolicy, WorkerReady
from .placement import WorkerLoad

if TYPE_CHECKING:
    from .request_table import Entry


@dataclass(slots=True)
class WorkerInfo:
    worker_id: int
    role: str
    policy: WorkerPolicy                 # what the front last asked of it (SetPolicy)
    page_size: int
    ready: bool = False
    alive: bool = True
    num_pages: int = 0
    report: LoadReport | None = None
    reserved_pages: int = 0              # promised to handoffs on their way in
    outstanding_prefill_tokens: int = 0
    holding: int = 0                     # requests whose current block lives here (Entry.worker)
    row_invariance: RowInvariance | None = None
    tp_size: int = 1
    rank_rss_mb: tuple[float, ...] = ()
    rank_weights_mb: tuple[float, ...] = ()
    planned: bool = False                # held by a planned regroup: no routing
    retired: bool = False                # not part of the current layout

    @property
    def available(self) -> bool:
        return self.ready and self.alive and not self.planned and not self.retired

    @property
    def free_pages(self) -> int:
        return (self.report.free_pages if self.report else self.num_pages) - self.reserved_pages


class WorkerTable:
    def __init__(self, roles: list[str], page_size: int, policy: WorkerPolicy):
        self.workers = [WorkerInfo(i, r, policy, page_size) for i, r in enumerate(roles)]
        self.model: ModelInfo | None = None
        self.known_pages = 0                 # a pool seen ready (while a regroup leaves none serving)

    def __getitem__(self, wid: int) -> WorkerInfo:
        return self.workers[wid]

    def __iter__(self):
        return iter(self.workers)

    def __len__(self) -> int:
        return len(self.workers)

    def loads(self, minus: "Entry | None" = None) -> list[WorkerLoad]:
        """Every worker's load, leaving out the request `minus` (an Entry): its charge and its block."""
        charged = minus.charged if minus is not None and minus.charged else (None, 0)
        held = minus.worker if minus is not None else None
        return [WorkerLoad(w.worker_id, w.role, w.outstanding_prefill_tokens - (charged[1] if charged[0] ==
                           w.worker_id else 0), w.free_pages, w.num_pages, w.available,
                           w.report.num_active_decodes if w.report else 0, w.holding - (held == w.worker_id),
                           w.tp_size) for w in self.workers]

    def hold(self, entry: "Entry", wid: int | None) -> None:
        """The request's current block now lives on `wid` (None: on no worker)."""
        if entry.worker is not None:
            self.workers[entry.worker].holding -= 1
        if wid is not None:
            self.workers[wid].holding += 1
        entry.worker = wid

    @property
    def all_ready(self) -> bool:
        return all(w.ready for w in self.workers if not w.retired)

    @property
    def is_healthy(self) -> bool:
        """Every instance of the layout serves; those a planned regroup holds are not a failure."""
        return all(w.available for w in self.workers if not (w.planned or w.retired))

    def retire(self, wid: int) -> None:
        w = self.workers[wid]
        w.ready = w.alive = w.planned = False
        w.retired = True
        w.report, w.reserved_pages, w.outstanding_prefill_tokens, w.num_pages = None, 0, 0, 0

    def starting(self, wid: int) -> None:
        w = self.workers[wid]
        w.planned, w.retired, w.ready, w.alive, w.num_pages = True, False, False, True, 0

    def add_slot(self, role: str, policy: WorkerPolicy) -> int:
        """A new row, retired until a regroup starts an instance in it."""
        self.workers.append(WorkerInfo(len(self.workers), role, policy, self.workers[0].page_size, retired=True))
        return len(self.workers) - 1

    @property
    def has_prefill_role(self) -> bool:
        return any(w.role == "prefill" for w in self.workers)

    def charge(self, entry, wid: int, tokens: int) -> None:
        entry.charged = (wid, tokens)
        self.workers[wid].outstanding_prefill_tokens += tokens

    def uncharge(self, entry) -> None:
        if entry.charged is not None:
            wid, tokens = entry.charged
            self.workers[wid].outstanding_prefill_tokens -= tokens
            entry.charged = None

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.workers[0].page_size)

    def min_capacity_pages(self) -> int:
        """The smallest pool a canvas may have to fit where prefills run (during a regroup, the last one known)."""
        roles = {"prefill"} if self.has_prefill_role else {"colocated"}
        pools = [w.num_pages for w in self.workers if w.role in roles and not w.retired and w.num_pages]
        return min(pools) if pools else self.known_pages

    def on_ready(self, msg: WorkerReady) -> None:
        w = self.workers[msg.worker_id]
        w.ready, w.alive, w.num_pages, w.page_size = True, True, msg.num_pages, msg.page_size
        w.report, w.reserved_pages, w.outstanding_prefill_tokens = None, 0, 0
        w.row_invariance, w.tp_size, w.rank_rss_mb = msg.row_invariance, msg.tp_size, msg.rank_rss_mb
        w.rank_weights_mb = msg.rank_weights_mb
        w.planned = w.retired = False
        self.known_pages = msg.num_pages
        self.model = msg.model

    def on_report(self, wid: int, msg: LoadReport) -> bool:
        """True when the report is of a new iteration."""
        w = self.workers[wid]
        new = w.report is None or msg.num_iterations > w.report.num_iterations
        w.report = msg
        return new

    def lost(self, wids: set[int]) -> None:
        for wid in wids:
            w = self.workers[wid]
            w.alive = w.ready = False
            w.report, w.reserved_pages, w.outstanding_prefill_tokens = None, 0, 0

    def set_policy(self, worker_id: int | None, changes: dict) -> list[tuple[int, SetPolicy]]:
        """New runtime policies for one worker (or all), validated before any is applied; SetPolicy for live ones."""
        if not changes:
            return []
        targets = list(self.workers) if worker_id is None else [self.workers[worker_id]]
        new = [dataclasses.replace(w.policy, **changes) for w in targets]
        out = []
        for w, policy in zip(targets, new):
            w.policy = policy
            if w.alive:
                out.append((w.worker_id, SetPolicy(policy)))
        return out
