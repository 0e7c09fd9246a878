"""Layouts of model instances over the devices and how one changes into another: what stops and starts, in waves."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class Layout:
    """Device indices of every instance slot, in worker-id order; an empty tuple is a slot with no instance."""
    instances: tuple[tuple[int, ...], ...]

    @classmethod
    def of_degrees(cls, degrees: list[int]) -> "Layout":
        """Instances of these degrees over the devices in order (aligned when sorted largest first)."""
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
    """(slots that stop, slot -> devices of each instance that starts); a slot with the same devices is kept."""
    keep = {w for w, devs in enumerate(current.instances) if devs and devs in target.instances}
    stop = {w for w, devs in enumerate(current.instances) if devs and w not in keep}
    kept_devices = {current.instances[w] for w in keep}
    new = [devs for devs in target.instances if devs and devs not in kept_devices]
    free = sorted(w for w, devs in enumerate(current.instances) if w not in keep)
    slots = free + list(range(len(current.instances), len(current.instances) + len(new)))
    return stop, dict(zip(slots, new))


def plan_waves(current: Layout, stop: set[int], start: dict[int, tuple[int, ...]],
               max_devices: int | None = None) -> list[tuple[set[int], dict[int, tuple[int, ...]]]]:
    """A regroup in waves of at most `max_devices` devices; a new instance and every old one it takes devices from
    share a wave, whose new instances take only its own or unused slots (none waits for a later wave)."""
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
    free = [w for w, devs in enumerate(current.instances) if not devs]
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
    """Stage 2: place these degrees keeping the current instances worth most (else packed in order)."""
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
