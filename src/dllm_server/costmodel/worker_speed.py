"""The front's view of each worker's speed: a step-time model (seeded by its start-up profile, refined by its
reports) and its latest LoadReport, for the SLO policy, load control and routing."""
from __future__ import annotations

import collections
from typing import Callable

from ..messages import LoadReport
from .step_time import StepTimeModel, features, report_features
from .work_ahead import UnitCosts


def capacity_rate(iteration_s: Callable[[int], float], max_batch: int, max_iteration_s: float = float("inf"),
                  recompute_rows: Callable[[int], float] | None = None) -> float:
    """Request-forwards per second of one worker: the best (n + recompute_rows(n)) / t(n) over batch sizes n whose
    iteration fits `max_iteration_s` (batch 1 always counts)."""
    best = 0.0
    for n in range(1, max(1, max_batch) + 1):
        t = iteration_s(n)
        if t <= 0:
            continue
        if n > 1 and t > max_iteration_s:
            break                       # iteration time grows with the batch
        best = max(best, (n + (recompute_rows(n) if recompute_rows else 0.0)) / t)
    return best

class WorkerLoadModel:
    def __init__(self, block_length: int):
        self.block_length = block_length
        self.models: dict[int, StepTimeModel] = collections.defaultdict(StepTimeModel)
        self.reports: dict[int, LoadReport] = {}
        self.by_degree: dict[int, StepTimeModel] = {}     # the one model every instance of a TP degree shares

    def forget(self, worker_id: int) -> None:
        """The instance in this slot is gone (a regroup): the next one reads its own degree's model (`seed`)."""
        self.models.pop(worker_id, None)
        self.reports.pop(worker_id, None)

    def seed(self, worker_id: int, profile, tp_size: int | None = None) -> None:
        """`worker_id`'s model from its start-up profile. Instances of one TP degree (one device type per server) share
        one model, seeded by the first profile that fits it: fitted apart on their own reports, identical instances
        disagreed by up to 2x, and routing by completion sent work to whichever looked faster."""
        if tp_size is not None:
            shared = self.models[worker_id] = self.by_degree.setdefault(tp_size, self.models[worker_id])
            if shared.ready:
                return
        for d, dk, p, psq, seconds in profile:
            self.models[worker_id].add(features(d, dk, p, psq), seconds)

    def observe(self, worker_id: int, report: LoadReport) -> None:
        prev = self.reports.get(worker_id)
        self.reports[worker_id] = report
        if report.forward_s > 0 and (prev is None or report.num_iterations > prev.num_iterations):
            self.models[worker_id].add_report(report)

    def iteration_s(self, w: int, extra_rows: int = 0, extra_keys: int = 0, decode_only: bool = False) -> float:
        """One iteration on `w` as its latest report ran it, with `extra_rows` more; `decode_only` leaves out that
        iteration's prefills (a one-off re-prefill priced into every forward of the next block made the workers
        that last ran one look up to 10x slower to routing)."""
        m, r = self.models[w], self.reports.get(w)
        if r is None:
            return m.predict(features(self.block_length * max(1, extra_rows), max(256, extra_keys)))
        x = report_features(r) if not decode_only else features(r.iteration_tokens - r.prefill_tokens, r.decode_keys)
        x[1] += extra_rows * self.block_length
        x[2] += extra_keys / 1e3
        return m.predict(x) or r.iteration_s

    def reprefill_wait_s(self, w: int, outstanding_tokens: int | None = None) -> float:
        """How long a re-prefill queued there now waits: the prefill tokens ahead (the report's, or the front's own
        count when given, which already holds what was sent since the report) over the budget per iteration."""
        r = self.reports.get(w)
        if r is None or r.policy is None or r.policy.token_budget is None:
            return 0.0
        pol = r.policy
        allowance = max(pol.token_budget - (r.iteration_tokens - r.prefill_tokens), pol.token_budget * pol.credit_share)
        ahead = r.outstanding_prefill_tokens if outstanding_tokens is None else outstanding_tokens
        return self.iteration_s(w) * ahead / max(1.0, allowance)

    def costs(self, worker: int | None) -> tuple[float, float]:
        """(s per iteration, s a re-prefill waits) on `worker`, or on the best worker when it has none yet."""
        ids = [worker] if worker in self.reports else (list(self.reports) or list(self.models))
        best = None
        for w in ids:
            t, wait = self.iteration_s(w), self.reprefill_wait_s(w)
            if best is None or t + wait < sum(best):
                best = (t, wait)
        return best if best is not None else (0.0, 0.0)

    def completion_s(self, w: int, canvas_len: int, block_forwards: float,
                     outstanding_tokens: int | None = None) -> float:
        t = self.iteration_s(w, extra_rows=1, extra_keys=canvas_len, decode_only=True)
        r = self.reports.get(w)
        active = r.num_active_decodes if r is not None else 0
        if active and block_forwards > 0:
            # the requests running there re-prefill once a block each: that share of its iterations carries one
            share = min(1.0, active / block_forwards)
            x = features((r.iteration_tokens - r.prefill_tokens) + self.block_length, r.decode_keys + canvas_len,
                         canvas_len, canvas_len * canvas_len)
            t = (1 - share) * t + share * max(t, self.models[w].predict(x))
        return self.reprefill_wait_s(w, outstanding_tokens) + block_forwards * t

    def completion_estimates(self, workers, state, outstanding: dict[int, int] | None = None) -> dict[int, float]:
        """completion_s of the next block per worker; forwards from its finished blocks (half a block at first).
        `outstanding`: the front's prefill tokens per worker, current where the reports are up to a period old (a
        burst routed on reports alone all goes to the worker that last reported least)."""
        forwards, canvas = _next_block(state)
        return {w: self.completion_s(w, canvas, forwards, (outstanding or {}).get(w)) for w in workers}

    def alone_estimates(self, workers, state) -> dict[int, float]:
        """Seconds of the next block per worker with nothing else there: how fast an instance is, not how busy."""
        forwards, canvas = _next_block(state)
        return {w: forwards * self.models[w].predict(features(self.block_length, canvas)) for w in workers}

    def unit_costs(self, w: int) -> UnitCosts | None:
        """`w`'s UnitCosts from its step-time model; None before it has one."""
        m = self.models.get(w)
        if m is None or not m.ready:
            return None
        c = m.kinds[False].coef
        rec = m.kinds[True].coef
        if rec is not None:
            prefill_token_s, prefill_sq_s = float(rec[3]), float(rec[4]) / 1e6
        else:          # no recompute iteration seen yet: a prefill priced as that many decode tokens
            prefill_token_s, prefill_sq_s = float(c[1]) + float(c[2]) / 1e3, 0.0
        return UnitCosts(float(c[0]), self.block_length * float(c[1]), float(c[2]) / 1e3, prefill_token_s, prefill_sq_s)

    def capacity(self, max_iteration_s: float = float("inf"), arrival_rate: float = 0.0,
                 blocks_per_request: float = 1.0) -> float:
        """Request-forwards per second of all fitted workers with every iteration within `max_iteration_s`;
        arrivals (`arrival_rate` /s) add a recompute step per block, lengthening the iterations."""
        ready = [w for w, m in self.models.items() if m.ready]
        total = 0.0
        for w in ready:
            m, r = self.models[w], self.reports.get(w)
            seats = r.policy.max_active_decodes if r is not None and r.policy is not None else 64
            rows = (r.iteration_tokens - r.prefill_tokens) / self.block_length if r is not None else 0
            keys = r.decode_keys / rows if r is not None and rows >= 1 else 256
            lam = arrival_rate * max(1.0, blocks_per_request) / len(ready)   # recompute steps per second

            def step(n, m=m, k=keys, lam=lam) -> tuple[float, float]:
                t0 = m.predict(features(n * self.block_length, n * k))
                share = lam * t0
                if share <= 0:
                    return t0, 0.0
                return m.predict(features(n * self.block_length, n * k, share * k, share * k * k, recompute=True)), share
            total += capacity_rate(lambda n: step(n)[0], seats, max_iteration_s, lambda n: step(n)[1])
        return total

    def step_time_error(self) -> float | None:
        errs = [e for m in self.models.values() if (e := m.mean_abs_rel_error()) is not None]
        return sum(errs) / len(errs) if errs else None


def _next_block(state) -> tuple[float, int]:
    """(forwards the request's next block is expected to take: its finished blocks' mean, half a block at first;
    its canvas length)."""
    done = state.stats.steps_per_block
    forwards = sum(done) / len(done) if done else state.params.block_length / 2
    return forwards, state.prompt_len + state.answer_len
