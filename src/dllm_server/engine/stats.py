"""One typed snapshot of the engine's state: what /metrics, the server's periodic stats line, tests
and benchmarks read. Built on demand (cheap: a few fields per worker); never mutated."""
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
    up: bool                      # ready and alive
    num_pages: int
    free_pages: int               # as last reported (num_pages before the first report)
    reserved_pages: int           # promised to handoffs on their way in
    outstanding_prefill_tokens: int   # routed there, not yet started
    num_active_decodes: int
    iteration_tokens: int         # fed by its last iteration
    deficit_tokens: int
    num_iterations: int
    policy: WorkerPolicy
    pid: int | None = None
    row_invariance: RowInvariance | None = None   # the worker's batch-invariance self-check
    tp_size: int = 1                     # its tensor-parallel ranks (processes)
    rank_pids: tuple[int | None, ...] = ()
    rank_rss_mb: tuple[float, ...] = ()  # each rank's resident memory after loading
    prefix_cache: tuple[int, int, int, int] | None = None   # LoadReport.prefix_cache, as last reported

    @property
    def used_pages(self) -> int:
        return self.num_pages - self.free_pages


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int              # requests with a step seen
    num_waiting: int              # admitted, no step yet
    num_pending: int              # no worker could take them yet (of num_waiting)
    num_held: int                 # prefilled blocks waiting for a decode worker with room
    workers: tuple[WorkerStats, ...]
    counters: Counters
    overflow_threshold_tokens: int
    ticks: int = 0                # scheduler ticks (worker message batches handled)
    tick_s: float = 0.0           # front-loop seconds spent in them
    policy: dict | None = None    # the decode policy's own summary (SLO policy: cap, predictor error, ...)

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
    """Build the snapshot from a Scheduler's parts; `pids`: every rank's process id per worker."""
    workers = tuple(WorkerStats(
        w.worker_id, w.role, w.available, w.num_pages, w.report.free_pages if w.report else w.num_pages,
        w.reserved_pages, w.outstanding_prefill_tokens, w.report.num_active_decodes if w.report else 0,
        w.report.iteration_tokens if w.report else 0, w.report.deficit_tokens if w.report else 0,
        w.report.num_iterations if w.report else 0, w.policy, (pids.get(w.worker_id) or [None])[0], w.row_invariance,
        w.tp_size, tuple(pids.get(w.worker_id) or ()), w.rank_rss_mb, w.report.prefix_cache if w.report else None)
        for w in sched.workers)
    n_wait = sched.requests.num_waiting
    summary = sched.policy.summary() if hasattr(sched.policy, "summary") else None
    return EngineStats(len(sched.requests) - n_wait, n_wait, len(sched.requests.pending), len(sched.handoffs.held),
                       workers, dataclasses.replace(sched.counters), sched.theta, sched.ticks, sched.tick_s, summary)
