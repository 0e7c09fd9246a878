"""Stage 2 of DiLaServe's cluster planner (shared/reference/cluster_level.md 4.3): given the
instance counts per tensor-parallel degree that stage 1 (cluster/layout_ilp.py) chose, which GPUs form
which instance, disturbing the instances running now as little as possible. Pure; scipy
(`scipy.optimize.milp`, HiGHS) is imported only when a transition is solved.

Devices are numbered node-major (device = node x gpus_per_node + index in the node). An instance
of degree d sits in a slot (node, start, d) inside one node (NVLink), aligned: start % d == 0.

    vars  y_s in {0, 1} for every aligned slot s of a degree the target asks for
    min   sum_i w_i (1 - y_s(i))  +  eps sum_{s not current} y_s load(s) / (1 + total load)
    s.t.  sum_{s contains g} y_s <= 1 for every GPU g;   sum_{s: size d} y_s = target[d] for every d

i runs over the current instances, s(i) its slot, w_i = d_i + beta active_i: the GPUs a dissolved
instance disrupts plus the requests that must move off it (beta weighs a moved request against a
disrupted GPU). The eps term (below any difference in the first) forms new instances on idle or
lightly loaded GPUs first; load(g) = the active requests of the instance on g over its degree. A
current instance that is not an aligned slot (or of a degree the target has none of) cannot be
kept. The order of the waves that carry a transition out is not decided here.
"""
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
    """The slot of an instance on these (global, node-major) devices: consecutive, inside one node."""
    ds = sorted(devices)
    if not ds or ds != list(range(ds[0], ds[0] + len(ds))) or ds[0] // gpus_per_node != ds[-1] // gpus_per_node:
        raise ValueError(f"devices {list(devices)}: not consecutive GPUs inside one node of {gpus_per_node}")
    return Slot(ds[0] // gpus_per_node, ds[0] % gpus_per_node, len(ds))


def candidate_slots(gpus_per_node: int, num_nodes: int, degrees: Sequence[int]) -> list[Slot]:
    """Every aligned slot of these degrees, node by node, in device order."""
    return [Slot(node, start, d) for node in range(num_nodes) for d in sorted(set(degrees)) if d <= gpus_per_node
            for start in range(0, gpus_per_node - d + 1, d)]


@dataclass(frozen=True)
class Transition:
    kept: list[Slot]                 # current instances that stay as they are
    dissolved: list[Slot]            # current instances to drain and break up
    new: list[Slot]                  # instances to form
    disrupted_devices: list[int]     # GPUs of the dissolved instances
    regrouped_devices: list[int]     # GPUs whose instance changes: dissolved ones and new ones (idle ones too)
    moved_requests: int              # active requests on the dissolved instances
    cost: float                      # sum of w_i over the dissolved instances

    @property
    def layout(self) -> list[Slot]:
        return sorted(self.kept + self.new)


def plan_transition(current: Sequence[Slot], target_counts: Mapping[int, int], gpus_per_node: int, num_nodes: int,
                    active: Sequence[int] | None = None, beta: float = BETA,
                    tie_weight: float = TIE_WEIGHT) -> Transition:
    """Stage 2: the layout with target_counts[d] instances of each degree d that keeps the current
    instances worth most (w_i = d_i + beta active_i). ValueError when the target does not pack into
    the nodes or the current instances overlap or leave the cluster."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    current = [Slot(*s) for s in current]
    active = [0] * len(current) if active is None else list(active)
    if len(active) != len(current):
        raise ValueError(f"{len(active)} active counts for {len(current)} current instances")
    num_devices = gpus_per_node * num_nodes
    owner = [-1] * num_devices                           # device -> the current instance on it
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
    for k, s in enumerate(slots):             # new slots: the tie-break on the load they would disturb
        c[k] = tie_weight * load[list(s.devices(gpus_per_node))].sum() / (1.0 + total_load)
    for i, s in enumerate(current):           # keeping i saves w_i (the constant sum w_i left out)
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
