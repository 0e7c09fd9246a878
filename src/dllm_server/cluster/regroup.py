"""Live regrouping of model instances, one driver for the server and the simulator. Requests move between instances
only at recompute steps (from the front's copy of the canvas), so no KV moves; a drain finishes started blocks."""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

from ..messages import ContinueBlock, Evict
from .layout import Layout, changes, plan_layout, plan_waves
from .planner import PlannerState, decide

if TYPE_CHECKING:
    from ..scheduler.scheduler import Scheduler

log = logging.getLogger(__name__)


def drain_messages(wids: set[int], requests) -> list[tuple[int, object]]:
    """(worker, message) pairs that start draining `wids`: leases withdrawn, unstarted blocks asked back."""
    out = []
    for e in requests:
        w = e.worker
        if w not in wids:
            continue
        rid, k = e.state.request_id, e.state.block_index
        if rid in requests.leased:
            requests.set_lease(e, None)
            out.append((w, ContinueBlock(rid, k, None)))
        out.append((w, Evict(rid, k)))
    return out


def is_drained(wid: int, requests) -> bool:
    return all(e.worker != wid for e in requests)


@dataclass
class Regroup:
    """One regroup in progress, front side and clock-free (every method takes `now`); only the current wave drains."""
    current: Layout
    target: Layout
    stop: set[int]
    start: dict[int, tuple[int, ...]]
    started_at: float
    drained_at: dict[int, float] = field(default_factory=dict)
    retired_at: dict[int, float] = field(default_factory=dict)
    launched_at: dict[int, float] = field(default_factory=dict)
    evicted_before: int = 0
    waves: list[tuple[set[int], set[int]]] = field(default_factory=list)   # (slots stopping, slots starting)
    wave: int = 0
    wave_began_at: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        # a slot may stop in one wave and start again in a later one: two maps, not one
        self._stops_in = {w: k for k, (olds, _) in enumerate(self.waves) for w in olds}
        self._starts_in = {w: k for k, (_, news) in enumerate(self.waves) for w in news}

    @classmethod
    def begin(cls, sched, current: Layout, target: Layout, now: float,
              wave_share: float = 1.0) -> tuple["Regroup", list]:
        """Take the first wave (at most `wave_share` of the devices) out of routing; returns the drain messages."""
        stop, start = changes(current, target)
        waves = plan_waves(current, stop, start, max(1, int(wave_share * current.num_devices)))
        start = {w: devs for _, news in waves for w, devs in news.items()}
        rg = cls(current, target, stop, start, now, evicted_before=sched.counters.blocks_evicted,
                 waves=[(olds, set(news)) for olds, news in waves] or [(set(), set())])
        return rg, rg._drain(sched, now)

    def _drain(self, sched, now: float) -> list:
        olds = self.waves[self.wave][0]
        for w in olds:
            sched.workers[w].planned = True
        self.wave_began_at.append(now)
        return drain_messages(olds, sched.requests)

    def next_wave(self, sched, now: float) -> list:
        """The next wave's drain messages once the current wave's new instances all serve, else []."""
        news = self.waves[self.wave][1]
        if self.wave + 1 >= len(self.waves) or not all(w in self.launched_at and sched.workers[w].ready for w in news):
            return []
        self.wave += 1
        return self._drain(sched, now)

    def wave_of(self, w: int, starting: bool = False) -> int:
        """The wave in which slot `w` stops (or, `starting`, starts)."""
        return (self._starts_in if starting else self._stops_in)[w]

    def poll_drained(self, sched, now: float) -> list[int]:
        """Slots drained since the last call; the driver stops them."""
        out = [w for w in sorted(self.stop) if w not in self.drained_at and self.wave_of(w) <= self.wave
               and is_drained(w, sched.requests)]
        for w in out:
            self.drained_at[w] = now
        return out

    def retired(self, sched, w: int, now: float) -> None:
        sched.workers.retire(w)
        sched.load.forget(w)
        self.retired_at[w] = now

    def launchable(self) -> list[int]:
        busy = {g for w in self.stop if w not in self.retired_at for g in self.current.instances[w]}
        return [w for w, devs in sorted(self.start.items()) if w not in self.launched_at
                and self.wave_of(w, starting=True) <= self.wave and not (w in self.stop and w not in self.retired_at)
                and not busy.intersection(devs)]

    def launching(self, sched, w: int, now: float) -> None:
        """A new instance starts in slot w, out of routing until its WorkerReady."""
        while len(sched.workers) <= w:
            sched.workers.add_slot("colocated", sched.workers[0].policy)
        sched.workers.starting(w)
        sched.load.forget(w)
        self.launched_at[w] = now

    def all_ready(self, sched) -> bool:
        return len(self.launched_at) == len(self.start) and all(sched.workers[w].ready for w in self.start)

    def finish(self, sched, now: float) -> tuple[Layout, dict]:
        old = self.current.instances
        slots = max(len(old), max(self.start, default=-1) + 1)

        def devices(w: int) -> tuple[int, ...]:
            if w in self.start:
                return self.start[w]
            return old[w] if w < len(old) and w not in self.stop else ()
        layout = Layout(tuple(devices(w) for w in range(slots)))
        sched.retry_waiting()
        drain_s = {w: t - self.wave_began_at[self.wave_of(w)] for w, t in sorted(self.drained_at.items())}
        sched.counters.reconfigurations += 1
        sched.counters.drain_seconds += sum(drain_s.values())
        return layout, {"layout": layout.degrees(), "stopped": sorted(self.stop), "started": sorted(self.start),
                        "drain_s": {w: round(s, 3) for w, s in drain_s.items()}, "regroup_s": round(now - self.started_at, 3),
                        "blocks_evicted": sched.counters.blocks_evicted - self.evicted_before,
                        "waves": len(self.waves)}


class Actuator(Protocol):
    """How a driver stops and starts instances: the server's processes or the simulator's workers."""

    def stop(self, slot: int) -> None:
        """Stop the drained instance in `slot`; call Reconfigurer.stopped(slot) once it has."""

    def start(self, slot: int, devices: tuple[int, ...]) -> None:
        """Start a new instance on these devices in `slot`; it reports WorkerReady when it serves."""


@dataclass
class RegroupRecord:
    """One regroup as it ran, in seconds of the driver's clock; `source` and `target` are degrees."""
    began_s: float
    source: list[int]
    target: list[int]
    why: str
    drain_s: dict[int, float] = field(default_factory=dict)
    done_s: float | None = None
    drain_gpu_s: float = 0.0          # device-seconds of draining instances (serving only their last blocks)
    idle_gpu_s: float = 0.0           # device-seconds from a drain's end to the new instance's ready
    blocks_evicted: int = 0
    waves: int = 1
    peak_out_devices: int = 0
    result: dict = field(default_factory=dict)


class Reconfigurer:
    """Runs a Scheduler's regroups one at a time: `plan()` each period, `begin()` on demand, `poll()` on any change."""

    def __init__(self, sched: "Scheduler", actuator: Actuator, clock: Callable[[], float], layout: Layout,
                 heads: tuple[int, int], gpus_per_node: int, on_done: Callable[[RegroupRecord], None] | None = None):
        self.sched, self.actuator, self.clock, self.layout = sched, actuator, clock, layout
        self.heads, self.gpus_per_node, self.on_done = heads, gpus_per_node, on_done
        self.num_devices = layout.num_devices
        self.state = PlannerState()
        self.active: Regroup | None = None
        self.record: RegroupRecord | None = None
        self.records: list[RegroupRecord] = []
        self.layouts: list[tuple[float, list[int]]] = [(clock(), layout.degrees())]    # (since, degrees)
        self.decisions: list[tuple[float, dict]] = []
        self.ready_at: dict[int, float] = {}
        self._polling = False

    def plan(self) -> list[int] | None:
        if self.active is not None:
            return None
        sched, now = self.sched, self.clock()
        instances = {w: len(devs) for w, devs in enumerate(self.layout.instances) if devs}
        degrees = decide(sched.config, sched.policy, sched.load, instances, self.heads, self.num_devices,
                         list(sched.policy.arrivals), now, self.state)
        self.decisions.append((now, dict(self.state.last)))
        if degrees is not None:
            self.begin(degrees, self.state.last.get("why", ""))
        return degrees

    def begin(self, degrees: list[int], why: str) -> RegroupRecord:
        sched, now = self.sched, self.clock()
        target = plan_layout(self.layout, degrees, sched.requests, self.gpus_per_node)
        self.active, msgs = Regroup.begin(sched, self.layout, target, now, sched.config.reconfigure_wave_share)
        self.ready_at = {}
        self.record = RegroupRecord(now, self.layout.degrees(), target.degrees(), why)
        for w, msg in msgs:
            sched.send(w, msg)
        self.poll()
        return self.record

    def stopped(self, w: int) -> None:
        self.active.retired(self.sched, w, self.clock())
        if not self._polling:
            self.poll()

    def poll(self) -> None:
        """Stop what drained, start what can, drain the next wave, finish when every new instance serves."""
        rg, rec, sched = self.active, self.record, self.sched
        if rg is None:
            return
        self._polling = True
        try:
            msgs = [None]
            while msgs:                      # a wave that drains at once lets the next one begin
                for w in rg.poll_drained(sched, self.clock()):
                    began = rg.wave_began_at[rg.wave_of(w)]
                    rec.drain_s[w] = rg.drained_at[w] - began
                    rec.drain_gpu_s += len(rg.current.instances[w]) * (rg.drained_at[w] - began)
                    self.actuator.stop(w)
                for w in rg.launchable():
                    rg.launching(sched, w, self.clock())
                    self.actuator.start(w, rg.start[w])
                msgs = rg.next_wave(sched, self.clock())
                for w, msg in msgs:
                    sched.send(w, msg)
        finally:
            self._polling = False
        now = self.clock()
        for w in rg.start:
            if w in rg.launched_at and w not in self.ready_at and sched.workers[w].ready:
                self.ready_at[w] = now
        if len(rg.launched_at) == len(rg.start) and rg.all_ready(sched):
            self._finish(now)

    def _finish(self, now: float) -> None:
        rg, rec = self.active, self.record
        self.layout, result = rg.finish(self.sched, now)
        # a device idles from its old instance's stop (or the regroup's start) to its new instance's ready, or the end
        freed = {g: rg.retired_at[v] for v in rg.stop for g in rg.current.instances[v]}
        spans = [(freed.get(g, rg.started_at), self.ready_at[w]) for w, devs in rg.start.items() for g in devs]
        steps = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
        rec.peak_out_devices = max(itertools.accumulate(k for _, k in steps), default=0)
        used = {g for devs in rg.start.values() for g in devs}
        rec.idle_gpu_s = sum(self.ready_at[w] - freed.get(g, rg.started_at) for w, devs in rg.start.items()
                             for g in devs) + sum(now - t for g, t in freed.items() if g not in used)
        rec.waves, rec.done_s, rec.blocks_evicted, rec.result = len(rg.waves), now, result["blocks_evicted"], result
        self.state.out_s = (now - rec.began_s) / max(1, rec.waves)       # the planner's next restart price
        self.records.append(rec)
        self.layouts.append((now, self.layout.degrees()))
        self.active = self.record = None
        log.info("regrouped into %s in %.2f s (drains: %s)", result["layout"], result["regroup_s"], result["drain_s"])
        if self.on_done is not None:
            self.on_done(rec)

    def summary(self) -> dict:
        return {"regroups": len(self.records), "layouts": self.layouts,
                "drain_gpu_s": sum(r.drain_gpu_s for r in self.records),
                "idle_gpu_s": sum(r.idle_gpu_s for r in self.records),
                "blocks_evicted": sum(r.blocks_evicted for r in self.records),
                "decisions": len(self.decisions), "unfinished_regroup": self.active is not None}
