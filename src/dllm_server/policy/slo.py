"""SLOPolicy (DiLaServe): each block commits at the highest candidate threshold whose predicted
remaining latency fits what is left of the request's SLO, under a cluster-wide cap from load
control. A request that names its own rule (threshold, factor or steps) keeps it.

Fed by the scheduler (it `observes`): every step updates the request's Progress; the scheduler's
WorkerLoadModel (step-time models from the workers' profiles and iteration reports) is shared.
Decisions: `block_policy` when a block is dispatched; `revise`, once per scheduling tick, re-decides
the policy of every leased next block whose request progressed, in one batched prediction, and
updates the load-control cap (at most every CONTROL_INTERVAL_S).
"""
from __future__ import annotations

import collections
import time
from typing import Callable

import numpy as np

from ..decoding.params import BlockPolicy
from ..engine.request_state import GenerationOutput, RequestState
from ..messages import BlockDone, StepDelta
from .base import StaticPolicy, names_a_rule, request_rule
from .load_control import LoadController, demand_rate
from .load_model import WorkerLoadModel
from .progress import Progress, candidate_rows, feature_row
from .thresholds import allowed, choose_indices, remaining_seconds

CONTROL_INTERVAL_S = 0.2      # load control re-evaluates the cap at most this often
REVISE_INTERVAL_S = 0.2       # leased next blocks are re-decided at most this often (a block lasts longer)
DEFAULT_HORIZON_S = 10.0      # budget assumed for load control when a request has no SLO
ARRIVAL_WINDOW_S = 5.0        # the arrival rate load control sees: admissions over this window


class SLOPolicy(StaticPolicy):
    observes = True

    def __init__(self, config, predictor, load: WorkerLoadModel | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.all_candidates = config.candidate_thresholds          # what the workers count against
        self.candidates = tuple(c for c in self.all_candidates if c >= config.quality_floor)
        self.floor = config.quality_floor
        self.block_length = config.block_length
        self.default_slo_s = None if config.default_slo_ms is None else config.default_slo_ms / 1e3
        self.predictor = predictor
        self.clock = clock
        self.load = load if load is not None else WorkerLoadModel(config.block_length)
        self.progress: dict[str, Progress] = {}
        self.states: dict[str, RequestState] = {}
        self.where: dict[str, int] = {}
        self.decided: dict[str, dict[int, float]] = collections.defaultdict(dict)
        self.first_guess: dict[str, float] = {}                      # predicted forwards at admission
        self.work: dict[str, np.ndarray] = {}                        # latest remaining forwards per candidate
        self.new_work: np.ndarray | None = None                      # a new request's forwards per candidate (EWMA)
        self.arrivals: collections.deque = collections.deque(maxlen=4096)   # admission times
        self.budgets: collections.deque = collections.deque(maxlen=256)     # SLOs of recent admissions (s)
        self.controller = LoadController(self.candidates, target=config.load_target) if config.load_control else None
        self._controlled_at = self._revised_at = -1e9
        self.errors = {"oneshot": collections.deque(maxlen=2048), "online": collections.deque(maxlen=2048)}
        self.online_guess: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)
        self.predict_s = collections.deque(maxlen=1024)              # seconds per batched prediction
        self.predict_rows = collections.deque(maxlen=1024)

    @property
    def cap(self) -> float:
        return self.controller.cap if self.controller is not None else self.candidates[0]

    # ---- observations ----
    def on_step(self, state: RequestState, delta: StepDelta, worker_id: int, now: float) -> None:
        rid = state.request_id
        p = self.progress.get(rid)
        if p is None:
            p = self.progress[rid] = Progress.start(state)
        p.observe(delta, state)
        self.states[rid] = state
        self.where[rid] = worker_id

    def on_block_done(self, state: RequestState, msg: BlockDone) -> None:
        p = self.progress.get(state.request_id)
        if p is not None:
            p.end_block(msg.num_steps)

    def on_finish(self, state: RequestState, output: GenerationOutput, now: float) -> None:
        rid = state.request_id
        total = output.stats.num_forwards
        if output.finish_reason in ("stop", "length"):
            if rid in self.first_guess:
                self.errors["oneshot"].append(self.first_guess[rid] - total)
            for done, remaining in self.online_guess.get(rid, ()):
                self.errors["online"].append(done + remaining - total)
        for d in (self.progress, self.states, self.where, self.decided, self.first_guess, self.online_guess,
                  self.work):
            d.pop(rid, None)

    # ---- decisions ----
    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy:
        if names_a_rule(state):
            return request_rule(state, block_index, self.candidates[0])
        [tau] = self._choose([(state, block_index)], self.clock())
        return BlockPolicy(tau)

    def revise(self, leased: dict, now: float) -> dict[str, BlockPolicy]:
        """leased: {request: entry (.state, .lease)}; re-decide each progressed request's lease."""
        if self.controller is not None and now - self._controlled_at >= CONTROL_INTERVAL_S:
            self._control(now)
        if now - self._revised_at < REVISE_INTERVAL_S:
            return {}
        self._revised_at = now
        todo = [(e.state, e.state.block_index + 1, e.lease) for e in leased.values()
                if not names_a_rule(e.state) and (p := self.progress.get(e.state.request_id)) is not None and p.updated]
        if not todo:
            return {}
        taus = self._choose([(st, k) for st, k, _ in todo], now)
        return {st.request_id: BlockPolicy(t) for (st, _, pol), t in zip(todo, taus) if t != pol.threshold}

    def _choose(self, items: list[tuple[RequestState, int]], now: float) -> list[float]:
        """One batched prediction for every (request, block to decide), every candidate; the
        choice itself vectorised over requests (the front loop's cost grows slowly with load)."""
        cands = self.candidates
        progs, base, starting, budgets, costs = [], [], [], [], {}
        for st, k in items:
            p = self.progress.get(st.request_id) or Progress.start(st)
            p.updated = False
            progs.append(p)
            starting.append(p.block_index == k and p.step == 0)   # the decided block is the next to run
            base.append(feature_row(p, self.decided[st.request_id].get(p.block_index, self.cap),
                                    self.all_candidates))
            b = self._budget(st, now)
            budgets.append(np.inf if b is None else b)
            w = self.where.get(st.request_id)
            if w not in costs:
                costs[w] = self.load.costs(w)
        base = np.asarray(base)
        rows = candidate_rows(progs, base, cands, self.all_candidates)
        pred, cur = self._predict(rows, base, any(starting))
        r, n = len(items), len(cands)
        fut, fut_blocks = pred["fut_forwards"].reshape(r, n), pred["fut_blocks"].reshape(r, n)
        block_rem = np.where(np.asarray(starting)[:, None], pred["block_rem"].reshape(r, n) if "block_rem" in pred
                             else 0.0, cur["block_rem"][:, None])
        t_iter, t_wait = (np.asarray([costs[self.where.get(st.request_id)][j] for st, _ in items]) for j in (0, 1))
        secs = remaining_seconds(block_rem, fut, fut_blocks, t_iter[:, None], t_wait[:, None])
        pick = choose_indices(cands, secs, np.asarray(budgets), self.cap, self.floor)
        work = block_rem + fut
        out = []
        for i, ((st, k), p, j) in enumerate(zip(items, progs, pick)):
            tau = cands[j]
            rid = st.request_id
            self.decided[rid][k] = tau
            self.work[rid] = work[i]
            self.states[rid] = st
            if starting[i] and k == 0 and rid not in self.first_guess:     # an admission
                self.arrivals.append(now)
                self.new_work = work[i].copy() if self.new_work is None else 0.9 * self.new_work + 0.1 * work[i]
                if np.isfinite(budgets[i]):
                    self.budgets.append(budgets[i])
            remaining = float(work[i, j])
            if rid not in self.first_guess:                   # at admission: the one-shot estimate
                self.first_guess[rid] = p.forwards + remaining
            else:
                self.online_guess[rid].append((p.forwards, remaining))
            out.append(tau)
        return out

    def _predict(self, rows: np.ndarray, cur_rows: np.ndarray, starting: bool):
        """Later blocks at every candidate; the current block at its own threshold (at every
        candidate too when a decided block has not started yet)."""
        t = time.perf_counter()
        pred = self.predictor.predict(rows, ("fut_forwards", "fut_blocks", "block_rem") if starting else
                                      ("fut_forwards", "fut_blocks"))
        cur = self.predictor.predict(cur_rows, ("block_rem",))
        self.predict_s.append(time.perf_counter() - t)
        self.predict_rows.append(len(rows) + len(cur_rows))
        return pred, cur

    def _budget(self, st: RequestState, now: float) -> float | None:
        slo = st.sampling.slo_ms / 1e3 if st.sampling.slo_ms is not None else self.default_slo_s
        return None if slo is None else slo - (now - st.arrived_at)

    def _control(self, now: float) -> None:
        """Lower / raise the cap: the forward rate the load needs at each cap against what the
        workers can run within the SLO at that cap."""
        self._controlled_at = now
        live = [rid for rid in self.work if rid in self.states]
        if not live or self.new_work is None:
            return
        work = np.stack([self.work[rid] for rid in live])
        budgets = np.asarray([b if (b := self._budget(self.states[rid], now)) is not None else DEFAULT_HORIZON_S
                              for rid in live])
        inflight = demand_rate(work, budgets, 1.0)
        window = min(ARRIVAL_WINDOW_S, now - self.arrivals[0]) if self.arrivals else 0.0
        rate = sum(1 for t in self.arrivals if t >= now - ARRIVAL_WINDOW_S) / max(window, 1.0)
        demand = np.maximum(inflight, rate * self.new_work)
        slo = float(np.median(self.budgets)) if self.budgets else DEFAULT_HORIZON_S
        capacity = np.asarray([self.load.capacity(slo / max(1.0, w), rate) for w in self.new_work])
        self.controller.update(demand, capacity)

    # ---- observability ----
    def summary(self) -> dict:
        errs = {k: np.asarray(v, dtype=float) for k, v in self.errors.items()}
        return {"cap": self.cap, "predictor": self.predictor.name,
                "mae_forwards": {k: float(np.abs(e).mean()) if e.size else None for k, e in errs.items()},
                "step_time_rel_error": self.load.step_time_error(),
                "predict_ms_mean": 1e3 * float(np.mean(self.predict_s)) if self.predict_s else None,
                "predict_rows_mean": float(np.mean(self.predict_rows)) if self.predict_rows else None,
                "allowed": allowed(self.candidates, self.cap, self.floor)}
