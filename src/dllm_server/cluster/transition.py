"""Stage 2 of DiLaServe's cluster planner (docs/reconfiguration.md "Stage 2"): which GPUs form the instances
stage 1 chose, disturbing the running ones least. An instance sits in an aligned slot inside one node."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple, Sequence

import numpy as np

BETA = 0.1      # assumption: ten requests moved (a re-prefill each) weigh as much as one GPU regrouped
TIE_WEIGHT = 1e-3


class Slot(NamedTuple):
    node: int
    start: int           # first GPU's index inside the node
    size: int            # the instance's degree

    def devices(self, gpus_per_node: int) -> tuple[int, ...]:
        first = self.node * gpus_per_node + self.start
        return tuple(range(first, first + self.size))

    def aligned(self) -> bool:
        return self.start % self.size == 0


def slot_of(devices: Sequence[int], gpus_per_node: int) -> Slot:
    ds = sorted(devices)
    if not ds or ds != list(range(ds[0], ds[0] + len(ds))) or ds[0] // gpus_per_node != ds[-1] // gpus_per_node:
        raise ValueError(f"devices {list(devices)}: not consecutive GPUs inside one node of {gpus_per_node}")
    return Slot(ds[0] // gpus_per_node, ds[0] % gpus_per_node, len(ds))


def candidate_slots(gpus_per_node: int, num_nodes: int, degrees: Sequence[int]) -> list[Slot]:
    return [Slot(node, start, d) for node in range(num_nodes) for d in sorted(set(degrees)) if d <= gpus_per_node
            for start in range(0, gpus_per_node - d + 1, d)]


@dataclass(frozen=True)
class Transition:
    kept: list[Slot]
    dissolved: list[Slot]
    new: list[Slot]
    disrupted_devices: list[int]
    regrouped_devices: list[int]     # dissolved and new instances' GPUs, idle ones included
    moved_requests: int
    cost: float                      # sum of w_i over the dissolved instances

    @property
    def layout(self) -> list[Slot]:
        return sorted(self.kept + self.new)


def plan_transition(current: Sequence[Slot], target_counts: Mapping[int, int], gpus_per_node: int, num_nodes: int,
                    active: Sequence[int] | None = None, beta: float = BETA,
                    tie_weight: float = TIE_WEIGHT) -> Transition:
    """Stage 2: target_counts[d] instances of each degree keeping the current ones worth most (w_i = d_i + beta
    active_i); ValueError when the target does not pack or the current instances overlap or leave the cluster."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    current = [Slot(*s) for s in current]
    active = [0] * len(current) if active is None else list(active)
    if len(active) != len(current):
        raise ValueError(f"{len(active)} active counts for {len(current)} current instances")
    num_devices = gpus_per_node * num_nodes
    owner = [-1] * num_devices
    for i, s in enumerate(current):
        if not (0 <= s.node < num_nodes and 0 <= s.start and s.start + s.size <= gpus_per_node and s.size >= 1):
            raise ValueError(f"current instance {s} is not inside a node of the {num_nodes} x {gpus_per_node} cluster")
        for g in s.devices(gpus_per_node):
            if owner[g] >= 0:
                raise ValueError(f"current instances {current[owner[g]]} and {s} share GPU {g}")
            owner[g] = i
    want = {int(d): int(n) for d, n in target_counts.items() if n}
    if any(d > gpus_per_node or d < 1 for d in want):
        raise ValueError(f"target {want}: a degree outside 1..{gpus_per_node} (an instance stays inside a node)")
    weight = [s.size + beta * a for s, a in zip(current, active)]
    slots = candidate_slots(gpus_per_node, num_nodes, list(want))
    index = {s: k for k, s in enumerate(slots)}
    load = np.zeros(num_devices)
    for g, i in enumerate(owner):
        if i >= 0:
            load[g] = active[i] / current[i].size
    total_load = float(load.sum())
    c = np.zeros(len(slots))
    for k, s in enumerate(slots):
        c[k] = tie_weight * load[list(s.devices(gpus_per_node))].sum() / (1.0 + total_load)
    for i, s in enumerate(current):           # keeping i saves w_i (the constant sum of w_i left out)
        if s in index:
            c[index[s]] = -weight[i]
    rows = np.zeros((num_devices + len(want), len(slots)))
    for k, s in enumerate(slots):
        rows[list(s.devices(gpus_per_node)), k] = 1.0
    for r, d in enumerate(sorted(want)):
        rows[num_devices + r] = [1.0 if s.size == d else 0.0 for s in slots]
    counts = [float(want[d]) for d in sorted(want)]
    lo = np.concatenate([np.zeros(num_devices), counts])
    hi = np.concatenate([np.ones(num_devices), counts])
    if slots:
        res = milp(c, constraints=LinearConstraint(rows, lo, hi), bounds=Bounds(0, 1),
                   integrality=np.ones(len(slots)), options={"mip_rel_gap": 0.0})
        if res.x is None:
            raise ValueError(f"target {want} does not pack into {num_nodes} node(s) of {gpus_per_node} GPUs "
                             f"({res.message})")
        chosen = {slots[k] for k in np.flatnonzero(res.x > 0.5)}
    else:
        chosen = set()
    keep = [s in chosen for s in current]
    kept = [s for s, k in zip(current, keep) if k]
    dissolved = [s for s, k in zip(current, keep) if not k]
    new = sorted(chosen - set(kept))
    disrupted = sorted(g for s in dissolved for g in s.devices(gpus_per_node))
    regrouped = sorted(set(disrupted) | {g for s in new for g in s.devices(gpus_per_node)})
    return Transition(kept, dissolved, new, disrupted, regrouped,
                      moved_requests=int(sum(a for a, k in zip(active, keep) if not k)),
                      cost=float(sum(w for w, k in zip(weight, keep) if not k)))
