"""SLOPolicy (DiLaServe): each block commits at the highest candidate threshold whose predicted remaining latency,
priced with the work ahead on its worker (costmodel/work_ahead.py), fits the request's SLO, under load control's cap.
A request that names its own rule keeps it. The rules and their constants: docs/slo.md."""
from __future__ import annotations

import collections
import heapq
import time
from typing import Callable

import numpy as np

from ..decoding.params import BlockPolicy
from ..request.state import GenerationOutput, RequestState
from ..messages import BlockDone, StepDelta
from .base import StaticPolicy, names_a_rule, request_rule
from .load_control import LoadController, arrival_rate, demand_rate
from ..costmodel.worker_speed import WorkerLoadModel
from .progress import TAU, Progress, candidate_rows, feature_row
from ..costmodel.work_ahead import Others, queued_seconds
from .thresholds import (allowed, allowed_mask, choose_indices, forwards_per_block, lowest_allowed, price_blocks,
                         remaining_seconds)

CONTROL_INTERVAL_S = 0.2
RISE_AFTER_S = 5.0            # load control raises the cap only after this long calm: a bursty load lulls for seconds
REVISE_INTERVAL_S = 0.2
DEFAULT_HORIZON_S = 10.0      # budget assumed for load control when a request has no SLO
ARRIVAL_WINDOWS_S = (1.0, 5.0)
OTHERS_REFRESH_S = 0.02
CALIBRATION_QUANTILE = 0.85      # of finished requests' actual / predicted latency: the factor predictions are scaled by
CALIBRATION_MIN = 20            # finished requests before the factor applies
TIGHT_MEDIAN = 0.6      # no raise while the median admission needs more of its SLO than this alone at the floor


class SLOPolicy(StaticPolicy):
    observes = True

    def __init__(self, config, predictor, load: WorkerLoadModel | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.all_candidates = config.candidate_thresholds          # what the workers count against
        self.candidates = tuple(c for c in self.all_candidates if c >= config.quality_floor)
        self.floor = config.quality_floor
        self.default = config.threshold
        self.slack = config.slo_raise_slack
        self.block_length = config.block_length
        self.default_slo_s = None if config.default_slo_ms is None else config.default_slo_ms / 1e3
        self.predictor = predictor
        self.clock = clock
        self.load = load if load is not None else WorkerLoadModel(config.block_length)
        self.progress: dict[str, Progress] = {}
        self.states: dict[str, RequestState] = {}
        self.where: dict[str, int] = {}
        self.decided: dict[str, dict[int, float]] = collections.defaultdict(dict)
        self.first_guess: dict[str, float] = {}
        self.first_latency: dict[str, float] = {}                    # predicted end-to-end seconds at admission
        self.latency_ratios: collections.deque = collections.deque(maxlen=200)    # actual / that prediction
        self.work: dict[str, np.ndarray] = {}                        # latest remaining forwards per candidate
        self.recomputes: dict[str, np.ndarray] = {}
        self.chosen: dict[str, int] = {}
        self.hopeless: set[str] = set()       # no allowed threshold predicted to meet the SLO at the last decision
        self.margins: dict[str, float] = {}   # SLO budget left over at the last decision (s; inf without an SLO)
        self.floor_needs: collections.deque = collections.deque(maxlen=256)   # admissions' SLO share alone at floor
        self.new_work: np.ndarray | None = None
        self.blocks_per_request = 1.0
        self.block_forwards: dict[float, float] = {}
        self.finished = 0
        self._fc = self._f = 0.0
        self.arrivals: collections.deque = collections.deque(maxlen=4096)
        # recent admissions with an SLO, as classes for the cluster planner: (budget s, forwards per candidate,
        # blocks, canvas)
        self.classes: collections.deque = collections.deque(maxlen=256)
        self.budgets: collections.deque = collections.deque(maxlen=256)   # SLO budgets (s) of recent admissions
        self.outcomes: collections.deque = collections.deque(maxlen=1024)   # (finished at, SLO met) with an SLO
        self.forward_ratios: collections.deque = collections.deque(maxlen=256)   # forwards run / predicted at admission
        self.controller = None if not config.load_control else LoadController(
            self.candidates, target=config.load_target, calm_updates=round(RISE_AFTER_S / CONTROL_INTERVAL_S))
        self._controlled_at = self._revised_at = -1e9
        self._queue_version = self._revised_version = 0
        self._others_cache = None
        self.errors = {"oneshot": collections.deque(maxlen=2048), "online": collections.deque(maxlen=2048)}
        self.online_guess: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)
        self.predict_s = collections.deque(maxlen=1024)
        self.predict_rows = collections.deque(maxlen=1024)

    @property
    def latency_scale(self) -> float:
        """How far finished requests' latency ran past its prediction at admission (a quantile of the ratio over
        the recent ones): the predictions of the queue and of the forwards left err together, by load."""
        if len(self.latency_ratios) < CALIBRATION_MIN:
            return 1.0
        return float(np.clip(np.quantile(self.latency_ratios, CALIBRATION_QUANTILE), 0.5, 4.0))

    @property
    def too_tight(self) -> bool:
        """The SLOs leave the typical request so little to spare even with a worker to itself at the floor that any
        raise delays someone who then misses (docs/slo.md "Tight SLOs")."""
        return len(self.floor_needs) >= CALIBRATION_MIN and float(np.median(self.floor_needs)) > TIGHT_MEDIAN

    def is_hopeless(self, request_id: str) -> bool:
        return request_id in self.hopeless

    @property
    def cap(self) -> float:
        return self.controller.cap if self.controller is not None else self.candidates[0]

    def on_step(self, state: RequestState, delta: StepDelta, worker_id: int, now: float) -> None:
        rid = state.request_id
        p = self.progress.get(rid)
        if p is None:
            p = self.progress[rid] = Progress.start(state)
        p.observe(delta, state)
        self.states[rid] = state
        if self.where.get(rid) != worker_id:
            self.where[rid] = worker_id
            self._queue_version += 1

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
                if self.first_guess[rid] > 0:
                    self.forward_ratios.append(total / self.first_guess[rid])
            slo = state.sampling.slo_ms / 1e3 if state.sampling.slo_ms is not None else self.default_slo_s
            if slo is not None and output.stats.latency_s is not None:
                self.outcomes.append((now, output.stats.latency_s <= slo))
            if rid in self.first_latency and output.stats.latency_s and self.first_latency[rid] > 0:
                self.latency_ratios.append(output.stats.latency_s / self.first_latency[rid])
            for done, remaining in self.online_guess.get(rid, ()):
                self.errors["online"].append(done + remaining - total)
            stats = output.stats
            blocks = len(stats.steps_per_block)
            if blocks:
                self.blocks_per_request = blocks if not self.finished else \
                    0.95 * self.blocks_per_request + 0.05 * blocks
            if len(stats.block_policies) == blocks:   # forwards per block as run: cluster/planner.py plans with them
                for steps, pol in zip(stats.steps_per_block, stats.block_policies):
                    old = self.block_forwards.get(pol.threshold)
                    self.block_forwards[pol.threshold] = steps if old is None else 0.95 * old + 0.05 * steps
            f, c = float(total), float(state.prompt_len + state.answer_len)
            self._fc, self._f = (f * c, f) if not self.finished else (0.95 * self._fc + 0.05 * f * c,
                                                                      0.95 * self._f + 0.05 * f)
            self.finished += 1
        for d in (self.progress, self.states, self.where, self.decided, self.first_guess, self.online_guess,
                  self.work, self.recomputes, self.chosen, self.first_latency, self.margins):
            d.pop(rid, None)
        self.hopeless.discard(rid)
        self._queue_version += 1

    @property
    def seated_canvas(self) -> float | None:
        """Finished requests' canvas weighted by their forwards (a long one is seated longer); None before any."""
        return self._fc / self._f if self._f > 0 else None

    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy:
        if names_a_rule(state):
            return request_rule(state, block_index, self.candidates[0])
        [tau] = self._choose([(state, block_index)], self.clock())
        return BlockPolicy(tau)

    def block_policies(self, items: list[tuple[RequestState, int]]) -> list[BlockPolicy]:
        own = [names_a_rule(st) for st, _ in items]
        chosen = iter(self._choose([it for it, o in zip(items, own) if not o], self.clock()) if not all(own) else [])
        return [request_rule(st, k, self.candidates[0]) if o else BlockPolicy(next(chosen))
                for (st, k), o in zip(items, own)]

    def revise(self, entries, now: float) -> list[tuple[str, int, BlockPolicy]]:
        """Re-decides running and leased blocks whose progress moved or whose worker's queue changed."""
        self._control_if_due(now)
        if now - self._revised_at < REVISE_INTERVAL_S:
            return []
        self._revised_at = now
        queue_moved = self._queue_version != self._revised_version
        self._revised_version = self._queue_version
        todo = []
        for e in entries:
            st = e.state
            rid = st.request_id
            if names_a_rule(st) or rid not in self.work:
                continue
            p = self.progress.get(rid)
            if not (queue_moved or (p is not None and p.updated)):
                continue
            if e.worker is not None:
                todo.append((st, st.block_index, self.decided[rid].get(st.block_index)))
            if e.lease is not None:
                todo.append((st, st.block_index + 1, e.lease.threshold))
        if not todo:
            return []
        taus = self._choose([(st, k) for st, k, _ in todo], now)
        return [(st.request_id, k, BlockPolicy(t)) for (st, k, old), t in zip(todo, taus) if t != old]

    def _choose(self, items: list[tuple[RequestState, int]], now: float) -> list[float]:
        self._control_if_due(now)           # after a quiet spell the cap is stale: revise() has not run
        cands = self.candidates
        progs, base, current, budgets = [], [], [], []
        for st, k in items:
            p = self.progress.get(st.request_id) or Progress.start(st)
            p.updated = False
            progs.append(p)
            current.append(p.block_index == k)
            base.append(feature_row(p, self.decided[st.request_id].get(p.block_index, self.cap), self.all_candidates))
            b = self._budget(st, now)
            budgets.append(np.inf if b is None else b)
        base = np.asarray(base)
        rows = candidate_rows(progs, base, cands, self.all_candidates)
        pred, cur = self._predict(rows, base)
        r, n = len(items), len(cands)
        current = np.asarray(current)
        fut, fut_blocks = pred["fut_forwards"].reshape(r, n), pred["fut_blocks"].reshape(r, n)
        block_rem = np.where(current[:, None], pred["block_rem"].reshape(r, n), cur["block_rem"][:, None])
        starting = np.asarray([c and p.step == 0 for c, p in zip(current, progs)])
        per_block = forwards_per_block(cands, self.block_forwards) if self.predictor.name == "simple" else None
        if per_block is not None:     # the estimator prices blocks alike at every threshold: not so
            last = np.asarray([p.block_fraction(p.num_blocks - 1) for p in progs])
            masked = np.asarray([p.masked_in_block / p.block_length for p in progs])
            order = np.argsort(cands)
            running = np.interp(base[:, TAU], np.asarray(cands)[order], per_block[order])   # at its own threshold
            fut, block_rem = price_blocks(per_block, fut_blocks, current, masked, last, running)
        work = block_rem + fut
        # an unstarted block begins with a recompute step; a block-causal request recomputes only its prefill
        causal = np.asarray([st.params.block_causal for st, _ in items])
        first = np.asarray([k == 0 for _, k in items])
        recomputes = np.where(causal[:, None], (starting & first)[:, None] * 1.0, fut_blocks + starting[:, None])
        secs, bound, alone, spill, room = self._seconds(items, work, recomputes, block_rem, fut, fut_blocks)
        scale = self.latency_scale
        spares = (scale * spill <= room[:, None]) & (not self.too_tight)
        pick = choose_indices(cands, scale * secs, np.asarray(budgets), self.cap, self.floor, self.default, self.slack,
                              alone, spares=spares)
        # hopeless only when even the worker to itself could not make it: the queue estimate errs under load
        meets = (allowed_mask(cands, self.cap, self.floor) & (bound <= np.asarray(budgets)[:, None])).any(axis=1)
        out = []
        for i, ((st, k), p, j) in enumerate(zip(items, progs, pick)):
            tau = cands[j]
            rid = st.request_id
            if meets[i]:
                self.hopeless.discard(rid)
            else:
                self.hopeless.add(rid)
            self.decided[rid][k] = tau
            if rid not in self.work:
                self._queue_version += 1
            self.work[rid], self.recomputes[rid], self.chosen[rid] = work[i], recomputes[i], int(j)
            self.margins[rid] = float(budgets[i] - scale * secs[i, j])
            self.states[rid] = st
            if starting[i] and k == 0 and rid not in self.first_guess:
                self.arrivals.append(now)
                self.new_work = work[i].copy() if self.new_work is None else 0.9 * self.new_work + 0.1 * work[i]
                if np.isfinite(budgets[i]):
                    self.floor_needs.append(float(bound[i, -1] / max(budgets[i], 1e-9)))
                    self.budgets.append(float(budgets[i]))
                if np.isfinite(budgets[i]) and (per_block is not None or self.predictor.name != "simple"):
                    # before any block has run the estimator prices every threshold alike, and pessimistically:
                    # such a class would stay in the planner's sample for 256 admissions
                    self.classes.append((budgets[i], work[i].copy(), float(recomputes[i].max()),
                                         st.prompt_len + st.answer_len))
            remaining = float(work[i, j])
            if rid not in self.first_guess:
                self.first_guess[rid] = p.forwards + remaining
                self.first_latency[rid] = now - st.arrived_at + float(secs[i, j])
            else:
                self.online_guess[rid].append((p.forwards, remaining))
            out.append(tau)
        return out

    def _seconds(self, items, work, recomputes, block_rem, fut, fut_blocks) -> tuple[np.ndarray, ...]:
        """[R, C] predicted remaining latency with the work ahead on the request's worker (the best one if unplaced),
        [R, C] the same with the worker to itself (a lower bound), [R] whether it would have it to itself, [R, C] the
        seconds its forwards above the floor's add to the others there, and [R] the least SLO budget those others
        have left over (inf: none with an SLO it meets)."""
        units = {w: u for w in sorted(self.load.models) if (u := self.load.unit_costs(w)) is not None}
        workers = list(units)
        new = {st.request_id for st, _ in items if st.request_id not in self.work}    # admissions in this call

        def solo(rid: str) -> bool:
            return not new - {rid}

        if not workers:
            costs = [self.load.costs(self.where.get(st.request_id)) for st, _ in items]
            t_iter = np.asarray([c[0] for c in costs])[:, None]
            t_wait = np.asarray([c[1] for c in costs])[:, None]
            alone = np.asarray([solo(st.request_id) and all(r == st.request_id for r in self.work) for st, _ in items])
            secs = remaining_seconds(block_rem, fut, fut_blocks, t_iter, t_wait)
            return secs, secs, alone, np.zeros_like(secs), np.full(len(items), np.inf)
        others = self._others(workers)
        secs, bound, spill = np.empty_like(work), np.empty_like(work), np.empty_like(work)
        alone = np.zeros(len(items), dtype=bool)
        room = np.full(len(items), np.inf)
        at_floor = lowest_allowed(self.candidates, self.cap, self.floor)
        lows = self._least_margins(workers)
        nobody = Others.empty()
        # a burst decided in one call: each new request sees those before it at the cap's work, 1/W on each worker
        at_cap = int(np.argmin(np.abs(np.asarray(self.candidates) - self.cap)))
        peers: list[tuple[float, float, float]] = []
        for i, (st, _) in enumerate(items):
            rid = st.request_id
            w = self.where.get(rid)
            canvas = float(st.prompt_len + st.answer_len)
            own = None
            if rid in self.work:       # already among the others at its last decision: taken out
                j = self.chosen[rid]
                own = (float(self.work[rid][j]), float(self.recomputes[rid][j]), 1.0 if w is not None else
                       1.0 / len(workers))
            options = [w] if w in units else workers
            ahead = {o: others[o].plus(peers, 1.0 / len(workers)) for o in options} if peers else others
            per = [queued_seconds(work[i], recomputes[i], canvas, ahead[o], units[o], own) for o in options]
            secs[i] = np.min(per, axis=0)
            o = options[int(np.argmin([p[at_floor] for p in per]))]
            spill[i] = units[o].row_s(np.asarray(canvas)) * np.maximum(work[i] - work[i, at_floor], 0.0)
            room[i] = next((m for m, r in lows.get(o, ()) if r != rid), np.inf)
            bound[i] = np.min([queued_seconds(work[i], recomputes[i], canvas, nobody, units[o]) for o in options],
                              axis=0)
            alone[i] = solo(rid) and any(others[o].weight.sum() - (own[2] if own else 0.0) < 1e-9 for o in options)
            if rid not in self.work:
                peers.append((float(work[i, at_cap]), float(recomputes[i, at_cap]), canvas))
        return secs, bound, alone, spill, room

    def _least_margins(self, workers: list[int]) -> dict[int, list[tuple[float, str]]]:
        """Per worker, the two least budgets left over (with their requests) among those there or not yet routed
        that are predicted to meet their SLO: a raise that costs them more makes one of them miss."""
        ok = [(m, r) for r, m in self.margins.items() if 0 <= m < np.inf]
        unrouted = heapq.nsmallest(2, [(m, r) for m, r in ok if self.where.get(r) is None])
        return {w: heapq.nsmallest(2, unrouted + [(m, r) for m, r in ok if self.where.get(r) == w]) for w in workers}

    def _others(self, workers: list[int]) -> dict[int, Others]:
        """Live requests' remaining work per worker (an unplaced one: 1/W on each). Cached until the live set changes
        or OTHERS_REFRESH_S passes on the policy's clock, so a simulation decides the same however fast it runs."""
        now = self.clock()
        key = (self._queue_version, tuple(workers))
        if self._others_cache is not None and self._others_cache[0] == key and \
                now - self._others_cache[1] < OTHERS_REFRESH_S:
            return self._others_cache[2]
        out = self._build_others(workers)
        self._others_cache = (key, now, out)
        return out

    def _build_others(self, workers: list[int]) -> dict[int, Others]:
        rids = [rid for rid in self.work if rid in self.states]
        if not rids:
            return {w: Others.empty() for w in workers}
        f = np.asarray([self.work[r][self.chosen[r]] for r in rids])
        rc = np.asarray([self.recomputes[r][self.chosen[r]] for r in rids])
        canvas = np.asarray([self.states[r].prompt_len + self.states[r].answer_len for r in rids], dtype=float)
        where = [self.where.get(r) for r in rids]
        out = {}
        for w in workers:
            weight = np.asarray([1.0 if x == w else (1.0 / len(workers) if x is None else 0.0) for x in where])
            keep = weight > 0
            out[w] = Others(f[keep], rc[keep], canvas[keep], weight[keep])
        return out

    def _predict(self, rows: np.ndarray, cur_rows: np.ndarray):
        t = time.perf_counter()
        pred = self.predictor.predict(rows, ("fut_forwards", "fut_blocks", "block_rem"))
        cur = self.predictor.predict(cur_rows, ("block_rem",))
        self.predict_s.append(time.perf_counter() - t)
        self.predict_rows.append(len(rows) + len(cur_rows))
        return pred, cur

    def _budget(self, st: RequestState, now: float) -> float | None:
        slo = st.sampling.slo_ms / 1e3 if st.sampling.slo_ms is not None else self.default_slo_s
        return None if slo is None else slo - (now - st.arrived_at)

    def _control_if_due(self, now: float) -> None:
        if self.controller is not None and now - self._controlled_at >= CONTROL_INTERVAL_S:
            self._control(now)

    def _control(self, now: float) -> None:
        self._controlled_at = now
        live = [rid for rid in self.work if rid in self.states]
        if not live and self.arrivals and now - self.arrivals[-1] > max(ARRIVAL_WINDOWS_S):
            self.controller.cap_index = 0      # idle past the rate's memory: nothing left to cap for
        if not live or self.new_work is None:
            return
        work = np.stack([self.work[rid] for rid in live])
        budgets = np.asarray([b if (b := self._budget(self.states[rid], now)) is not None else DEFAULT_HORIZON_S
                              for rid in live])
        inflight = demand_rate(work, budgets, 1.0)
        rate = arrival_rate(self.arrivals, now, ARRIVAL_WINDOWS_S)
        demand = np.maximum(inflight, rate * self.new_work)
        slo = float(np.median(self.budgets)) if self.budgets else DEFAULT_HORIZON_S
        capacity = np.asarray([self.load.capacity(slo / max(1.0, w), rate, self.blocks_per_request)
                               for w in self.new_work])
        self.controller.update(demand, capacity)

    def summary(self) -> dict:
        errs = {k: np.asarray(v, dtype=float) for k, v in self.errors.items()}
        return {"cap": self.cap, "predictor": self.predictor.name,
                "mae_forwards": {k: float(np.abs(e).mean()) if e.size else None for k, e in errs.items()},
                "step_time_rel_error": self.load.step_time_error(),
                "predict_ms_mean": 1e3 * float(np.mean(self.predict_s)) if self.predict_s else None,
                "predict_rows_mean": float(np.mean(self.predict_rows)) if self.predict_rows else None,
                "allowed": allowed(self.candidates, self.cap, self.floor)}
