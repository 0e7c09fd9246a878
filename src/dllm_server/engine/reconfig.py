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
messages; the scheduler and the engine send them (the simulator could drive the same code).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..messages import ContinueBlock, Evict


@dataclass(slots=True)
class Regroup:
    """One regroup in progress: the instances it drains and when each drain began and ended."""
    draining: set[int]
    started_at: float
    drained_at: dict[int, float] = field(default_factory=dict)
    evicted: int = 0                      # blocks taken back before they started
    migrated: int = 0                     # blocks re-dispatched away from a draining instance


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


async def run_regroup(engine, target: Layout, timeout_s: float) -> dict:
    """Move `engine` (an AsyncEngine, mp backend, colocated) from its layout to `target` while it
    serves: drain the instances that change, stop them, start the new ones, each serving once it
    is ready. Returns what happened, with the time each drain and the whole regroup took."""
    import asyncio
    import time
    sched, pool = engine.scheduler, engine.pool
    stop, start = changes(engine.layout, target)
    t0 = time.monotonic()
    for w in stop:
        sched.workers[w].planned = True
    for w, msg in drain_messages(stop, sched.requests):
        engine._send(w, msg)
    drain_s: dict[int, float] = {}
    deadline = t0 + timeout_s
    while len(drain_s) < len(stop):
        for w in stop:
            if w not in drain_s and is_drained(w, sched.requests):
                drain_s[w] = time.monotonic() - t0
        if time.monotonic() > deadline:
            raise TimeoutError(f"reconfigure: instances {sorted(set(stop) - set(drain_s))} not drained in "
                               f"{timeout_s:g} s")
        await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    for w in sorted(stop):
        await loop.run_in_executor(None, pool.retire, w)
        sched.workers.retire(w)
        sched.load.forget(w)
        engine.watchdog.reset(w)
    for w, devs in sorted(start.items()):
        if w == len(engine.roles):               # one more instance than slots so far
            engine.roles.append("colocated")
            engine.devices.append(())
            sched.workers.add_slot("colocated", sched.workers[0].policy)
        engine.devices[w] = tuple(engine.device_list[i] for i in devs)
        sched.workers.starting(w)
        sched.load.forget(w)
        engine.watchdog.reset(w)
        pool.start_instance(w)
    while not all(sched.workers[w].ready for w in start):
        if time.monotonic() > deadline + 120:
            raise TimeoutError(f"reconfigure: new instances {sorted(start)} not ready")
        await asyncio.sleep(0.02)
    old = engine.layout.instances

    def slot(w: int) -> tuple[int, ...]:
        if w in start:
            return start[w]
        return old[w] if w < len(old) and w not in stop else ()
    engine.layout = Layout(tuple(slot(w) for w in range(len(engine.roles))))
    sched._retry_waiting()
    sched.counters.reconfigurations += 1
    sched.counters.drain_seconds += sum(drain_s.values())
    return {"layout": engine.layout.degrees(), "stopped": sorted(stop), "started": sorted(start),
            "drain_s": {w: round(s, 3) for w, s in sorted(drain_s.items())},
            "regroup_s": round(time.monotonic() - t0, 3)}
