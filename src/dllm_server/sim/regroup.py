"""Live regroups in the simulator, through the engine's own code: every `reconfigure_period_s` of
simulated time (a RECONF event) the planner of cluster/planner.py `decide`s on the policy's inputs,
as AsyncEngine._plan does (or a given schedule names the degrees, for tests); the target layout is
stage 2's (cluster/regroup.py `plan_layout`); the drain is cluster/regroup.py's `Regroup` over the
real Scheduler (planned instances out of routing, leases withdrawn, unstarted blocks evicted and
re-dispatched). A drained instance's worker is retired at once; a new instance's worker is built
`regroup_s` after its devices are free (REGROUP_DONE: fresh WorkerCore, pool and cost model for
its degree) and serves once its WorkerReady, start-up profile included, reaches the front.
Devices between their old instance's drain and their new instance's ready serve nothing: that is
the regroup's cost, counted here in GPU-seconds with the drains'.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..cluster.planner import PlannerState, decide
from ..cluster.regroup import Layout, Regroup, plan_layout
from .behaviour import ParametricBehaviour
from .cluster import Simulator
from ..costmodel.gpu import MODELS
from .instances import layout_instances

# ASSUMPTION (not measured): from a drained instance's stop to its devices' new instance serving,
# for an 8B bf16 model on H100s: process and CUDA/NCCL start ~2-3 s, 16 GB of weights from the
# page cache or local NVMe at ~3 GB/s ~5 s (a degree-d shard is 1/d of it, read in parallel), the
# start-up profile ~1 s; about 10 s whatever the degree.
ASSUMED_RESTART_S = 10.0


def layout_simulator(degrees, cost_for, config, model: str = "llada-8b", seed: int = 0) -> Simulator:
    """A colocated Simulator of one layout (an instance per entry of `degrees`, each with its own
    cost `cost_for(d)` and pool), not run yet; a reconfiguring run attaches its Reconfigurer."""
    insts = layout_instances(degrees, cost_for, config.page_size)
    uniform = len(set(degrees)) == 1
    cfg = config.replace(num_workers=len(insts), tensor_parallel_size=degrees[0] if uniform else 1)
    shape = MODELS[model]
    return Simulator(cfg, None, ParametricBehaviour(model, seed), shape.model_info(), logit_shift=shape.logit_shift,
                     costs=[i.cost for i in insts], pages=[i.num_pages for i in insts])


@dataclass
class RegroupRecord:
    """One regroup, as it ran (simulated seconds)."""
    began_s: float
    source: list[int]                 # degrees before
    target: list[int]                 # degrees after
    why: str
    drain_s: dict[int, float] = field(default_factory=dict)       # slot -> its drain's length
    done_s: float | None = None
    drain_gpu_s: float = 0.0          # devices held by draining instances (serving only their last blocks)
    idle_gpu_s: float = 0.0           # devices between a drain's end and their new instance's ready
    blocks_evicted: int = 0
    waves: int = 1
    peak_out_devices: int = 0         # the most devices serving nothing at one time (stopped, not ready again)


class Reconfigurer:
    """Drives regroups in `sim` (a Simulator, colocated). `cost_for(d)`: a degree-d instance's cost
    model; `regroup_s`: from a drained instance's end to its devices' new instance starting up
    (process start, weights, profile: an assumption); `heads`: the model's (heads, kv_heads), for
    the degrees allowed; `schedule`: [(at_s, degrees)] to regroup on, instead of the planner."""

    def __init__(self, sim, cost_for, regroup_s: float, heads: tuple[int, int], gpus_per_node: int = 8,
                 schedule: list[tuple[float, list[int]]] | None = None, degrees: list[int] | None = None):
        self.sim, self.cost_for, self.regroup_s, self.heads = sim, cost_for, regroup_s, heads
        self.gpus_per_node = gpus_per_node
        self.schedule = sorted(schedule or [], key=lambda x: x[0])
        deg = degrees or [getattr(w.cost, "tp", 1) for w in sim.workers]
        self.layout = Layout.of_degrees(deg)
        self.num_devices = self.layout.num_devices
        self.state = PlannerState()
        self.active: Regroup | None = None
        self.record: RegroupRecord | None = None
        self.records: list[RegroupRecord] = []
        self.layouts: list[tuple[float, list[int]]] = [(0.0, self.layout.degrees())]   # (since, degrees)
        self.decisions: list[tuple[float, dict]] = []
        self.ready_at: dict[int, float] = {}             # new instance -> when the front sees it ready
        sim.regroup = self

    # ---- the simulator's calls ----
    def start(self) -> None:
        from .cluster import RECONF
        period = self.sim.config.reconfigure_period_s
        for k, (at, degrees) in enumerate(self.schedule):
            self.sim._push(at, RECONF, k, degrees)
        if not self.schedule:
            self.sim._push(period, RECONF, None)

    def on_reconf(self, k) -> None:
        sim = self.sim
        if k is not None:                                  # a scripted regroup
            if self.active is None and sorted(self.schedule[k][1]) != sorted(self.layout.degrees()):
                self.begin(self.schedule[k][1], "scheduled")
            return
        if sim.arrivals_left or sim.entries:               # the planner runs while there is work
            from .cluster import RECONF
            sim._push(sim.now + sim.config.reconfigure_period_s, RECONF, None)
        if self.active is not None:                        # as AsyncEngine._plan: one regroup at a time
            return
        policy = sim.scheduler.policy
        instances = {w: len(devs) for w, devs in enumerate(self.layout.instances) if devs}
        degrees = decide(sim.config, policy, sim.scheduler.load, instances, self.heads, self.num_devices,
                         list(policy.arrivals), sim.now, self.state)
        self.decisions.append((sim.now, dict(self.state.last)))
        if degrees is not None:
            self.begin(degrees, self.state.last.get("why", ""))

    def begin(self, degrees: list[int], why: str) -> None:
        sim = self.sim
        sched = sim.scheduler
        target = plan_layout(self.layout, degrees, sched.requests, self.gpus_per_node)
        self.active, msgs = Regroup.begin(sched, self.layout, target, sim.now, sim.config.reconfigure_wave_share)
        self.ready_at: dict[int, float] = {}
        self.record = RegroupRecord(sim.now, self.layout.degrees(), target.degrees(), why)
        for w, msg in msgs:
            sim._send(w, msg)
        self.poll()

    def poll(self) -> None:
        """After every delivery to the front while a regroup runs: stop what drained, start what
        can start, finish when every new instance serves."""
        rg, sim, rec = self.active, self.sim, self.record
        sched = sim.scheduler
        from .cluster import REGROUP_DONE
        msgs = [None]
        while msgs:                      # a wave that drains at once lets the next one begin
            for w in rg.poll_drained(sched, sim.now):
                sim.retire_worker(w)
                rg.retired(sched, w, sim.now)
                began = rg.wave_began_at[rg.wave_of(w)]
                rec.drain_s[w] = sim.now - began
                rec.drain_gpu_s += len(rg.current.instances[w]) * (sim.now - began)
            for w in rg.launchable():
                rg.launching(sched, w, sim.now)
                sim._push(sim.now + self.regroup_s, REGROUP_DONE, w, len(rg.start[w]))
            msgs = rg.next_wave(sched, sim.now)
            for w, msg in msgs:
                sim._send(w, msg)
        if len(rg.launched_at) == len(rg.start) and rg.all_ready(sched):
            self.layout, result = rg.finish(sched, sim.now)
            # each device idles from its old instance's stop (the regroup's start if it had none)
            # to its new instance's ready; a device no new instance uses idles to the end
            freed = {g: rg.retired_at[v] for v in rg.stop for g in rg.current.instances[v]}
            rec.waves = len(rg.waves)
            spans = [(freed.get(g, rg.started_at), self.ready_at[w]) for w, devs in rg.start.items() for g in devs]
            steps = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
            rec.peak_out_devices = max(itertools.accumulate(k for _, k in steps), default=0)
            used = {g for devs in rg.start.values() for g in devs}
            rec.idle_gpu_s = sum(self.ready_at[w] - freed.get(g, rg.started_at) for w, devs in rg.start.items()
                                 for g in devs) + sum(sim.now - t for g, t in freed.items() if g not in used)
            rec.done_s, rec.blocks_evicted = sim.now, result["blocks_evicted"]
            self.records.append(rec)
            self.layouts.append((sim.now, self.layout.degrees()))
            self.active = self.record = None

    def on_ready(self, w: int, degree: int) -> None:
        """REGROUP_DONE: the new instance in slot w is up; its WorkerReady is on its way."""
        c = self.cost_for(degree)
        self.ready_at[w] = self.sim.now + self.sim.latency_s      # when the front sees it
        self.sim.install_worker(w, c, c.kv_pool_tokens() // self.sim.wc.page_size)

    def summary(self) -> dict:
        return {"regroups": len(self.records), "layouts": self.layouts,
                "drain_gpu_s": sum(r.drain_gpu_s for r in self.records),
                "idle_gpu_s": sum(r.idle_gpu_s for r in self.records),
                "blocks_evicted": sum(r.blocks_evicted for r in self.records),
                "decisions": len(self.decisions), "unfinished_regroup": self.active is not None}
