"""The cluster simulator: the real Scheduler and one real WorkerCore per worker on a virtual clock, with only
the forward and the KV transport simulated (docs/simulation.md). At one instant, deliveries come before turns;
the front's own processing takes no simulated time (it has its own core)."""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import statistics
import time
from dataclasses import dataclass, field
from functools import partial

import torch

from ..config import ServerConfig
from ..decoding.params import SamplingParams, request_seed
from ..scheduler.placement import worker_roles
from ..request.state import RequestState
from ..request.events import STREAM_NONE
from ..scheduler.request_table import Entry
from ..scheduler.scheduler import Scheduler
from ..messages import ModelInfo, WorkerReady
from ..policy.base import FixedPolicy
from ..costmodel.worker_speed import WorkerLoadModel
from ..worker.core import WorkerCore
from ..worker.handoff import WorkerHandoffs
from ..worker.kv_pool import KVPool
from ..worker.runner import window_lead
from ..worker.turn import take_turn
from .behaviour import SimRequest
from .instances import startup_profile
from .stepper import SimStepper
from .transport import Fabric, SimTransport

ARRIVE, TO_WORKER, TO_FRONT, TURN, WAKE, RECONF, REGROUP_DONE = range(7)
_LATER = (0, 0, 0, 1, 1, 1, 0)    # per kind: deliveries, arrivals and ready instances before turns and planning


@dataclass(slots=True)
class RequestResult:
    seq: int
    arrival_s: float
    prompt_len: int
    max_tokens: int
    finish_reason: str                # "stop" | "length" | "error" | "rejected" (the waiting queue was full)
    latency_s: float | None = None
    first_token_s: float | None = None
    tokens: int = 0
    forwards: int = 0
    thresholds: tuple = ()            # each block's commit threshold, as run
    slo_ms: float | None = None

    @property
    def slo_met(self) -> bool | None:
        """Finished within its SLO (None without one)."""
        if self.slo_ms is None:
            return None
        return self.finish_reason in ("stop", "length") and self.latency_s is not None and \
            self.latency_s <= self.slo_ms / 1e3


@dataclass
class SimResult:
    requests: list[RequestResult]
    iterations: dict[int, list[tuple]]     # recorded per worker: (start_s, turn_s, prefills, prefill_tokens,
                                           # decode_tokens, decodes, deficit_tokens)
    makespan_s: float
    wall_s: float
    num_events: int
    counters: object
    unfinished: int

    def latencies(self) -> list[float]:
        return [r.latency_s for r in self.requests if r.latency_s is not None and r.finish_reason in ("stop", "length")]

    def summary(self) -> dict:
        lat = self.latencies()
        done = [r for r in self.requests if r.finish_reason in ("stop", "length")]
        q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0] if lat else float("nan")] * 99
        span = self.makespan_s or float("nan")
        met = [r.slo_met for r in self.requests if r.slo_ms is not None]
        taus = [t for r in done for t in r.thresholds]
        return {"requests": len(self.requests), "completed": len(done), "unfinished": self.unfinished,
                "rejected": sum(r.finish_reason == "rejected" for r in self.requests),
                "errors": sum(r.finish_reason == "error" for r in self.requests),
                "mean_s": statistics.mean(lat) if lat else float("nan"), "p50_s": statistics.median(lat) if lat
                else float("nan"), "p90_s": q[89], "p99_s": q[98], "req_s": len(done) / span,
                "tok_s": sum(r.tokens for r in done) / span, "makespan_s": self.makespan_s,
                "wall_s": self.wall_s, "events": self.num_events,
                "slo_attainment": sum(met) / len(met) if met else None,
                "mean_threshold": statistics.mean(taus) if taus else None}


class _Sink:
    """Entry.events for a simulated request: the final output is its only event."""
    __slots__ = ("sim", "seq")

    def __init__(self, sim: "Simulator", seq: int):
        self.sim, self.seq = sim, seq

    def put_nowait(self, event) -> None:
        if event.output is not None:
            self.sim._finished(self.seq, event.output)


@dataclass(slots=True)
class _Worker:
    wid: int
    core: WorkerCore | None
    transport: SimTransport | None
    cost: object
    min_turn_s: float
    log: list
    retired: bool = False             # a regroup stopped it: its events are dropped, as WorkerPool drops them
    inbox: list = field(default_factory=list)
    num_iterations: int = 0
    busy_until: float = 0.0
    turn_pending: bool = False


class _Unread(WorkerLoadModel):
    """Step-time models nobody reads (routing by load, a policy that does not observe): skip their upkeep."""

    def observe(self, worker_id, report) -> None:
        pass


class Simulator:
    """Runs a workload on the virtual clock. `cost` is every worker's cost model or, with `costs` (one per worker),
    the one whose message latency and KV link they share; `pages` defaults to each cost's pool."""

    def __init__(self, config: ServerConfig, cost, behaviour, model: ModelInfo, *, logit_shift: int = 0,
                 policy=None, record: bool = False, costs: list | None = None, pages: list[int] | None = None):
        self.roles = worker_roles(config.placement, config.num_workers, config.num_prefill_workers)
        n = len(self.roles)
        wc = config.worker_config()
        if costs is not None and len(costs) != n:
            raise ValueError(f"costs: {len(costs)} cost models for {n} workers")
        cost = cost if cost is not None else costs[0]
        if pages is None:
            pages = [c.kv_pool_tokens() // wc.page_size if hasattr(c, "kv_pool_tokens") else wc.num_pages
                     for c in costs] if costs is not None else [wc.num_pages] * n
        if len(pages) != n:
            raise ValueError(f"pages: {len(pages)} page counts for {n} workers")
        costs = list(costs) if costs is not None else [cost] * n
        self.config, self.cost, self.behaviour, self.model = config, cost, behaviour, model
        self.costs, self.pages = costs, list(pages)
        self.record = record
        self.now = 0.0
        self._heap: list = []
        self._order = itertools.count()
        self.latency_s = cost.message_latency_s
        if policy is None:
            policy, load = self._policy(config)
        else:       # a given SLOPolicy's step-time models are the scheduler's, as in AsyncEngine
            load = getattr(policy, "load", None)
        if load is None and config.routing == "load" and not policy.observes:
            load = _Unread(config.block_length)
        self.scheduler = Scheduler(config, self.roles, None, self._send, policy, clock=self.clock, load=load)
        self.fill_id = next(i for i in range(3, 1 << 20) if i not in (model.mask_id, model.eos_id))
        handoffs = "prefill" in self.roles and len(self.roles) > 1    # as worker_pool.uses_process_group
        self.fabric = Fabric(cost, self.clock, self._wake, [getattr(c, "tp", 1) for c in costs]) if handoffs else None
        self.handoffs, self.lead, self.wc = handoffs, window_lead(logit_shift, config.dream_decoding), wc
        self.logs: dict[int, list] = {}                  # recorded iterations per slot, across regroups
        self.workers: list[_Worker | None] = []
        ready = []
        for wid, (c, num_pages) in enumerate(zip(costs, self.pages)):
            w, msg = self.make_worker(wid, c, num_pages)
            self.workers.append(w)
            ready.append(msg)
        for msg in ready:
            self.scheduler.on_messages(msg.worker_id, [msg])
            self.scheduler.tick()
        self.results: dict[int, RequestResult] = {}
        self.entries: dict[int, Entry] = {}
        self.num_events = 0
        self.arrivals_left = 0
        self.regroup = None                              # sim/regroup.py's SimRegroups

    def make_worker(self, wid: int, c, num_pages: int) -> tuple[_Worker, WorkerReady]:
        """A fresh worker for slot `wid` and its WorkerReady (with a start-up profile where the config asks)."""
        wc, model = self.wc, self.model
        wcw = wc if num_pages == wc.num_pages else dataclasses.replace(wc, num_pages=num_pages)
        stepper = SimStepper(wc.cache, self.lead, self.behaviour, c, model.eos_id, self.fill_id)
        pool = KVPool(0, num_pages, wc.page_size, 1, 1, torch.float32)   # page bookkeeping, no tensors
        transport = SimTransport(wid, self.fabric) if self.handoffs else None
        w = _Worker(wid, None, transport, c, max(c.idle_turn_s, 1e-6), self.logs.setdefault(wid, []))  # every turn moves time on
        w.core = stepper.core = WorkerCore(wcw, stepper, pool, model.mask_id, WorkerHandoffs(wid, pool, transport)
                                           if self.handoffs else None, emit=partial(self._emit, w))
        profile = startup_profile(c, wc.block_length, wc.cache, self.lead, model.max_len, num_pages, wc.page_size) \
            if wc.profile else ()
        return w, WorkerReady(wid, num_pages, wc.page_size, model, profile, tp_size=getattr(c, "tp", 1))

    def retire_worker(self, wid: int) -> None:
        w = self.workers[wid]
        if w is not None:
            w.retired = True
        self.workers[wid] = None

    def install_worker(self, wid: int, c, num_pages: int) -> None:
        while len(self.workers) <= wid:
            self.workers.append(None)
        w, msg = self.make_worker(wid, c, num_pages)
        self.workers[wid] = w
        self._push(self.now + self.latency_s, TO_FRONT, w, [msg])

    def clock(self) -> float:
        return self.now

    def _policy(self, config: ServerConfig):
        """The decode policy a server with this config runs, on the virtual clock."""
        if config.threshold_policy != "slo":
            return FixedPolicy(config.threshold), None
        from ..policy.predictor import SimpleEstimator, load_predictor
        from ..policy.slo import SLOPolicy
        load = WorkerLoadModel(config.block_length)
        predictor = load_predictor(config.step_predictor, ".") if config.step_predictor else SimpleEstimator()
        return SLOPolicy(config, predictor, load, clock=self.clock), load

    def _push(self, at: float, kind: int, a, b=None) -> None:
        heapq.heappush(self._heap, (at, _LATER[kind], next(self._order), kind, a, b))

    def _send(self, wid: int, msg) -> None:
        w = self.workers[wid] if wid < len(self.workers) else None
        if w is not None:                                # no instance in the slot (a regroup)
            self._push(self.now + self.latency_s, TO_WORKER, w, msg)

    def _emit(self, w: _Worker, msgs: list) -> None:    # a worker's out-of-turn put (KVSent before its data)
        self._push(self.now + self.latency_s, TO_FRONT, w, list(msgs))

    def _wake(self, wid: int, at: float) -> None:
        self._push(at, WAKE, wid)

    def run(self, requests: list[SimRequest], max_sim_s: float | None = None) -> SimResult:
        t0 = time.perf_counter()
        for seq, req in enumerate(requests):
            self._push(req.arrival_s, ARRIVE, seq, req)
        self.arrivals_left = len(requests)
        if self.regroup is not None:
            self.regroup.on_start()
        heap, pop = self._heap, heapq.heappop
        on_messages, tick = self.scheduler.on_messages, self.scheduler.tick
        while heap:
            at, _, _, kind, a, b = pop(heap)
            if max_sim_s is not None and at > max_sim_s:
                break
            self.now = at
            self.num_events += 1
            if kind == TO_FRONT:
                if not a.retired:
                    on_messages(a.wid, b)
                    tick()
                    if self.regroup is not None and self.regroup.active:
                        self.regroup.driver.poll()
            elif kind == TURN:
                if not a.retired:
                    self._turn(a)
            elif kind == TO_WORKER:
                if not a.retired:
                    a.inbox.append(b)
                    self._poke(a)
            elif kind == WAKE:
                if self.workers[a] is not None:
                    self._poke(self.workers[a])
            elif kind == ARRIVE:
                self.arrivals_left -= 1
                self._arrive(a, b)
            elif kind == RECONF:
                self.regroup.on_reconf(a)
            else:
                self.regroup.on_ready(a, b)
        for seq, entry in self.entries.items():
            self.results[seq] = RequestResult(seq, entry.arrived_at, entry.state.prompt_len,
                                              entry.state.params.max_tokens, "unfinished",
                                              slo_ms=entry.state.sampling.slo_ms)
        done = [r.arrival_s + r.latency_s for r in self.results.values() if r.latency_s is not None]
        return SimResult([self.results[i] for i in sorted(self.results)],
                         {wid: log for wid, log in self.logs.items()} if self.record else {},
                         max(done, default=0.0) - min((r.arrival_s for r in requests), default=0.0),
                         time.perf_counter() - t0, self.num_events, self.scheduler.counters, len(self.entries))

    def _arrive(self, seq: int, req: SimRequest) -> None:
        cfg = self.config
        if self.scheduler.requests.num_waiting >= cfg.max_waiting_requests:   # AsyncEngine.submit's 503
            self.results[seq] = RequestResult(seq, self.now, req.prompt_len, req.max_tokens, "rejected",
                                              slo_ms=req.slo_ms)
            return
        sampling = SamplingParams(max_tokens=req.max_tokens, ignore_eos=req.ignore_eos, threshold=req.threshold,
                                  slo_ms=req.slo_ms, steps=req.steps)
        params = sampling.resolve(cfg.block_length, request_seed(cfg.seed, seq), self.model.block_size)
        rid = f"r{seq}"
        st = RequestState(rid, None, [self.fill_id] * req.prompt_len, sampling, params, self.model.mask_id,
                          (self.model.eos_id,), seq)
        self.behaviour.register(rid, seq, req)
        entry = self.entries[seq] = Entry(st, _Sink(self, seq), STREAM_NONE, self.now)
        self.scheduler.add(entry)
        self.scheduler.tick()

    def _finished(self, seq: int, output) -> None:
        entry = self.entries.pop(seq)
        st = entry.state
        first = entry.first_token_at - entry.arrived_at if entry.first_token_at is not None else None
        self.results[seq] = RequestResult(seq, entry.arrived_at, st.prompt_len, st.params.max_tokens,
                                          output.finish_reason, output.stats.latency_s, first, len(output.token_ids),
                                          output.stats.num_forwards,
                                          tuple(p.threshold for p in output.stats.block_policies),
                                          st.sampling.slo_ms)
        self.behaviour.forget(st.request_id, st.num_blocks)

    def _poke(self, w: _Worker) -> None:
        if not w.turn_pending:
            w.turn_pending = True
            self._push(max(self.now, w.busy_until), TURN, w)

    def _turn(self, w: _Worker) -> None:
        w.turn_pending = False
        msgs, w.inbox = w.inbox, []
        core, cost = w.core, w.cost
        took = [0.0, False]

        def turn_s(stepped: bool) -> float:
            took[0] = max(cost.turn_s(core.last) if stepped else cost.idle_turn_s, w.min_turn_s)
            took[1] = stepped
            return took[0]

        out, w.num_iterations = take_turn(core, msgs, w.wid, w.num_iterations, turn_s)
        last = core.last
        if w.transport is not None:
            w.transport.flush(self.now + last.forward_s)
        end = w.busy_until = self.now + took[0]
        if out:
            self._push(end + self.latency_s, TO_FRONT, w, out)
        fed = took[1] and last.num_prefills + last.num_decodes
        if self.record and fed:
            w.log.append((self.now, took[0], last.num_prefills, last.prefill_tokens, last.decode_tokens,
                          last.num_decodes, last.deficit_tokens))
        # a stalled iteration (nothing fed) changes nothing until a message or a transfer arrives
        if fed and core.has_work:
            self._poke(w)
