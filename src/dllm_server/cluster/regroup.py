"""Live regrouping of model instances (DiLaServe's reconfiguration), the front's side: which
instances change, and draining them without losing a request.

Requests move between instances only at recompute steps: a block's full-canvas forward (its
re-prefill) can run anywhere from the front's own copy of the canvas, so no KV ever moves. A drain:
1. the instance leaves routing (`planned`: no new blocks, no new leases there);
2. its leases are withdrawn (ContinueBlock(then=None)), so no request continues there by itself;
3. its blocks that have not started are taken back (Evict -> Evicted(removed)) and re-dispatched
   to the other instances (or wait in the pending queue when none serves);
4. its running blocks finish their block and come back to the router like any block without a
   lease. Drained when no request's block is there any more: about one block's forwards.
Then the processes stop and the new layout's instances start in their devices; each enters
routing when it reports ready, with a fresh step-time model. This module decides and returns
messages; the scheduler and the engine send them. `Regroup` is one regroup's progress, front-side
and clock-free: the engine (`run_regroup`, wall clock, processes) and the simulator
(sim/regroup.py, virtual clock, simulated workers) drive the same one. An instance's devices go
to a new one as soon as every instance they belonged to has drained; each new instance starts
when all of its devices are free.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from ..messages import ContinueBlock, Evict
from ..scheduler.scheduler import retry_waiting


def drain_messages(wids: set[int], requests) -> list[tuple[int, object]]:
    """(worker, message) to send when `wids` start draining: every lease there withdrawn, every
    block there asked back (the worker gives back only those that have not started)."""
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
    """No request's current block lives on the instance any more."""
    return all(e.worker != wid for e in requests)


@dataclass(frozen=True, slots=True)
class Layout:
    """A layout: the devices (indices into the engine's device list) of every instance slot, in
    worker-id order; an empty tuple is a slot with no instance."""
    instances: tuple[tuple[int, ...], ...]

    @classmethod
    def of_degrees(cls, degrees: list[int]) -> "Layout":
        """Instances of these degrees over the devices in order (aligned: a degree-d instance
        starts at a multiple of d when the degrees are sorted largest first)."""
        out, at = [], 0
        for d in degrees:
            out.append(tuple(range(at, at + d)))
            at += d
        return cls(tuple(out))

    @property
    def num_devices(self) -> int:
        return sum(len(i) for i in self.instances)

    def degrees(self) -> list[int]:
        return [len(i) for i in self.instances if i]


def changes(current: Layout, target: Layout) -> tuple[set[int], dict[int, tuple[int, ...]]]:
    """(slots whose instance stops, slot -> devices of each instance that starts). A slot keeps
    its instance when its devices are the same; the target's other instances go to the slots
    freed (or new ones), in order."""
    keep = {w for w, devs in enumerate(current.instances) if devs and devs in target.instances}
    stop = {w for w, devs in enumerate(current.instances) if devs and w not in keep}
    kept_devices = {current.instances[w] for w in keep}
    new = [devs for devs in target.instances if devs and devs not in kept_devices]
    free = sorted(w for w, devs in enumerate(current.instances) if w not in keep)
    slots = free + list(range(len(current.instances), len(current.instances) + len(new)))
    return stop, dict(zip(slots, new))


def plan_waves(current: Layout, stop: set[int], start: dict[int, tuple[int, ...]],
               max_devices: int | None = None) -> list[tuple[set[int], dict[int, tuple[int, ...]]]]:
    """A regroup in waves: [(slots that stop, slot -> devices of each instance that starts)], each
    wave out of service while the previous ones' new instances serve. The unit is a group: a new
    instance with every old one it takes devices from, transitively (they cannot move apart);
    groups go in device order into waves of at most `max_devices` devices (None: one wave; a
    group larger than that is a wave of its own). Each wave's new instances take its own stopped
    slots first, then slots that had no instance, then slots past the layout, in order, so no
    new instance waits for a slot a later wave frees. One wave gives `changes`' slots."""
    owner = {g: w for w in stop for g in current.instances[w]}
    groups: list[tuple[set[int], list[tuple[int, ...]]]] = []
    for devs in (start[w] for w in sorted(start)):
        olds = {owner[g] for g in devs if g in owner}
        hit = [g for g in groups if g[0] & olds]
        merged = (olds.union(*(g[0] for g in hit)), [n for g in hit for n in g[1]] + [devs])
        groups = [g for g in groups if g not in hit] + [merged]
    covered = set().union(*(g[0] for g in groups)) if groups else set()
    groups += [({w}, []) for w in sorted(stop - covered)]

    def devices(g) -> set[int]:
        return {d for w in g[0] for d in current.instances[w]} | {d for n in g[1] for d in n}
    groups.sort(key=lambda g: min(devices(g), default=0))
    cap = max_devices if max_devices is not None else current.num_devices + sum(map(len, start.values()))
    waves: list[tuple[set[int], list]] = []
    size = 0
    for g in groups:
        n = len(devices(g))
        if not waves or size + n > cap:
            waves.append((set(), []))
            size = 0
        waves[-1][0].update(g[0])
        waves[-1][1].extend(g[1])
        size += n
    free = [w for w, devs in enumerate(current.instances) if not devs]       # slots with no instance
    fresh, rank = len(current.instances), {start[w]: k for k, w in enumerate(sorted(start))}
    out = []
    for olds, news in waves:
        pool = sorted(set(free) | olds)
        while len(pool) < len(news):
            pool.append(fresh)
            fresh += 1
        out.append((olds, dict(zip(pool, sorted(news, key=rank.get)))))
        free = pool[len(news):]
    return out


def plan_layout(current: Layout, degrees: Sequence[int], requests, gpus_per_node: int) -> Layout:
    """Stage 2 (cluster/transition.py): which devices form the instances of these degrees, keeping
    the current instances worth most (their devices plus the scheduler's `requests` seated in each
    slot, beta-weighted) in aligned slots inside nodes of `gpus_per_node`. Falls back to the
    degrees packed in order (largest first) when the layout does not split into such nodes."""
    from .transition import plan_transition, slot_of
    n = current.num_devices
    counts = Counter(degrees)
    active = Counter(e.worker for e in requests if e.worker is not None)
    try:
        if n % gpus_per_node:
            raise ValueError(f"{n} devices are not nodes of {gpus_per_node}")
        slots = [(w, slot_of(devs, gpus_per_node)) for w, devs in enumerate(current.instances) if devs]
        t = plan_transition([s for _, s in slots], counts, gpus_per_node, n // gpus_per_node,
                            active=[active.get(w, 0) for w, _ in slots])
    except ValueError:
        return Layout.of_degrees(sorted(degrees, reverse=True))
    return Layout(tuple(s.devices(gpus_per_node) for s in t.layout))


@dataclass
class Regroup:
    """One regroup in progress, from `current` to `target` (front side, clock-free: every method
    takes `now`). `stop`: slots whose instance drains and stops; `start`: slot -> devices of each
    new instance. It runs in `waves` (plan_waves: the stopping slots of each, their new
    instances in `start`); only the current wave drains. The driver sends `begin`'s messages,
    calls `poll_drained` as messages arrive, stops each instance it returns (then `retired`),
    starts each slot `launchable` returns (after `launching`), sends `next_wave`'s messages (the
    next wave's drain, once the current wave's new instances serve), and calls `finish` once every
    new instance is ready."""
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
        self._wave_of = {w: k for k, (olds, news) in enumerate(self.waves) for w in olds | news}

    @classmethod
    def begin(cls, sched, current: Layout, target: Layout, now: float,
              wave_share: float = 1.0) -> tuple["Regroup", list]:
        """Take the first wave's instances out of routing (a wave takes at most `wave_share` of
        the devices, config.reconfigure_wave_share); returns the regroup and the (worker, message)
        pairs that start their drains."""
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
        """Once the current wave's new instances all serve, the next wave's drain messages
        (nothing while it is not time, or after the last wave)."""
        news = self.waves[self.wave][1]
        if self.wave + 1 >= len(self.waves) or not all(w in self.launched_at and sched.workers[w].ready for w in news):
            return []
        self.wave += 1
        return self._drain(sched, now)

    def wave_of(self, w: int) -> int:
        return self._wave_of[w]

    def poll_drained(self, sched, now: float) -> list[int]:
        """Slots that have drained since the last call (in slot order); the driver stops them."""
        out = [w for w in sorted(self.stop) if w not in self.drained_at and self.wave_of(w) <= self.wave
               and is_drained(w, sched.requests)]
        for w in out:
            self.drained_at[w] = now
        return out

    def retired(self, sched, w: int, now: float) -> None:
        """The instance in slot w has stopped: its row leaves the layout, its step-time model goes."""
        sched.workers.retire(w)
        sched.load.forget(w)
        self.retired_at[w] = now

    def launchable(self) -> list[int]:
        """New instances whose slot and devices are all free now (not yet launched)."""
        busy = {g for w in self.stop if w not in self.retired_at for g in self.current.instances[w]}
        return [w for w, devs in sorted(self.start.items()) if w not in self.launched_at
                and self.wave_of(w) <= self.wave and not (w in self.stop and w not in self.retired_at) and not busy.intersection(devs)]

    def launching(self, sched, w: int, now: float) -> None:
        """A new instance starts in slot w (a new row when the layout has more instances): out of
        routing until its WorkerReady."""
        while len(sched.workers) <= w:
            sched.workers.add_slot("colocated", sched.workers[0].policy)
        sched.workers.starting(w)
        sched.load.forget(w)
        self.launched_at[w] = now

    def all_ready(self, sched) -> bool:
        return len(self.launched_at) == len(self.start) and all(sched.workers[w].ready for w in self.start)

    def finish(self, sched, now: float) -> tuple[Layout, dict]:
        """Every new instance serves: the layout now, and what happened."""
        old = self.current.instances
        slots = max(len(old), max(self.start, default=-1) + 1)

        def devices(w: int) -> tuple[int, ...]:
            if w in self.start:
                return self.start[w]
            return old[w] if w < len(old) and w not in self.stop else ()
        layout = Layout(tuple(devices(w) for w in range(slots)))
        retry_waiting(sched)
        drain_s = {w: t - self.wave_began_at[self.wave_of(w)] for w, t in sorted(self.drained_at.items())}
        sched.counters.reconfigurations += 1
        sched.counters.drain_seconds += sum(drain_s.values())
        return layout, {"layout": layout.degrees(), "stopped": sorted(self.stop), "started": sorted(self.start),
                        "drain_s": {w: round(s, 3) for w, s in drain_s.items()}, "regroup_s": round(now - self.started_at, 3),
                        "blocks_evicted": sched.counters.blocks_evicted - self.evicted_before,
                        "waves": len(self.waves)}


async def run_regroup(engine, target: Layout, timeout_s: float) -> dict:
    """Move `engine` (an AsyncEngine, mp backend, colocated) from its layout to `target` while it
    serves: drain the instances that change, stop each once drained, start each new one once its
    devices are free, each serving once it is ready. Returns what happened, with the time each
    drain and the whole regroup took."""
    import asyncio
    import time
    sched, pool, loop = engine.scheduler, engine.pool, asyncio.get_running_loop()
    rg, msgs = Regroup.begin(sched, engine.layout, target, time.monotonic(), engine.config.reconfigure_wave_share)
    for w, msg in msgs:
        engine._send(w, msg)
    deadline = rg.started_at + timeout_s
    while len(rg.launched_at) < len(rg.start) or len(rg.retired_at) < len(rg.stop):
        for w in rg.poll_drained(sched, time.monotonic()):
            await loop.run_in_executor(None, pool.retire, w)
            rg.retired(sched, w, time.monotonic())
            engine.watchdog.reset(w)
        for w in rg.launchable():
            while len(engine.roles) <= w:              # more instances than slots so far
                engine.roles.append("colocated")
                engine.devices.append(())
            engine.devices[w] = tuple(engine.device_list[i] for i in rg.start[w])
            rg.launching(sched, w, time.monotonic())
            engine.watchdog.reset(w)
            pool.start_instance(w)
        for w, msg in rg.next_wave(sched, time.monotonic()):
            engine._send(w, msg)
        if time.monotonic() > deadline:
            raise TimeoutError(f"reconfigure: instances {sorted(rg.stop - set(rg.drained_at))} not drained in "
                               f"{timeout_s:g} s")
        await asyncio.sleep(0.01)
    while not rg.all_ready(sched):
        if time.monotonic() > deadline + 120:
            raise TimeoutError(f"reconfigure: new instances {sorted(rg.start)} not ready")
        await asyncio.sleep(0.02)
    engine.layout, result = rg.finish(sched, time.monotonic())
    return result
