"""One immutable snapshot of the engine's state, built on demand, for /metrics, the stats line, tests and benches."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import WorkerPolicy
from ..messages import RowInvariance
from ..scheduler.counters import Counters


@dataclass(frozen=True, slots=True)
class WorkerStats:
    worker_id: int
    role: str
    up: bool
    num_pages: int
    free_pages: int               # as last reported (num_pages before the first report)
    reserved_pages: int
    outstanding_prefill_tokens: int
    num_active_decodes: int
    iteration_tokens: int
    deficit_tokens: int
    num_iterations: int
    policy: WorkerPolicy
    pid: int | None = None
    row_invariance: RowInvariance | None = None
    tp_size: int = 1
    rank_pids: tuple[int | None, ...] = ()
    rank_rss_mb: tuple[float, ...] = ()
    rank_weights_mb: tuple[float, ...] = ()
    prefix_cache: tuple[int, int, int, int] | None = None   # LoadReport.prefix_cache

    @property
    def used_pages(self) -> int:
        return self.num_pages - self.free_pages


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int              # requests with a step seen
    num_waiting: int
    num_pending: int              # of num_waiting: no worker could take them yet
    num_held: int                 # prefilled blocks waiting for a decode worker with room
    workers: tuple[WorkerStats, ...]
    counters: Counters
    overflow_threshold_tokens: int
    ticks: int = 0
    tick_s: float = 0.0
    policy: dict | None = None    # the decode policy's own summary
    num_leased: int = 0           # next blocks leased to the worker holding the request (scheduler/leases.py)

    @property
    def num_requests(self) -> int:
        return self.num_running + self.num_waiting

    @property
    def kv_pages_total(self) -> int:
        return sum(w.num_pages for w in self.workers)

    @property
    def kv_pages_used(self) -> int:
        return sum(w.used_pages for w in self.workers)

    @property
    def kv_usage(self) -> float:
        total = self.kv_pages_total
        return self.kv_pages_used / total if total else 0.0

    @property
    def workers_up(self) -> int:
        return sum(w.up for w in self.workers)


def snapshot(sched, pids: dict[int, list[int | None]]) -> EngineStats:
    """The snapshot of a Scheduler; `pids`: every rank's process id per worker."""
    workers = tuple(WorkerStats(
        w.worker_id, w.role, w.available, w.num_pages, w.report.free_pages if w.report else w.num_pages,
        w.reserved_pages, w.outstanding_prefill_tokens, w.report.num_active_decodes if w.report else 0,
        w.report.iteration_tokens if w.report else 0, w.report.deficit_tokens if w.report else 0,
        w.report.num_iterations if w.report else 0, w.policy, (pids.get(w.worker_id) or [None])[0], w.row_invariance,
        w.tp_size, tuple(pids.get(w.worker_id) or ()), w.rank_rss_mb, w.rank_weights_mb,
        w.report.prefix_cache if w.report else None)
        for w in sched.workers)
    n_wait = sched.requests.num_waiting
    summary = sched.policy.summary() if hasattr(sched.policy, "summary") else None
    return EngineStats(len(sched.requests) - n_wait, n_wait, len(sched.requests.pending), len(sched.handoffs.held),
                       workers, dataclasses.replace(sched.counters), sched.theta, sched.ticks, sched.tick_s, summary,
                       len(sched.requests.leased))
