"""Regroups in the simulator: the server's own Reconfigurer with a simulated actuator (a new instance serves
`restart_s` after its devices are free), run by the planner every period or by a schedule (tests)."""
from __future__ import annotations

from ..cluster.layout import Layout
from ..cluster.regroup import Reconfigurer
from ..costmodel.gpu import MODELS
from .behaviour import CURVES, ParametricBehaviour
from .cluster import RECONF, REGROUP_DONE, Simulator
from .instances import layout_instances

# ASSUMPTION (not measured): stop to new instance serving, 8B bf16 on H100s (breakdown: docs/reconfiguration.md)
ASSUMED_RESTART_S = 10.0


def layout_simulator(degrees, cost_for, config, model: str = "llada-8b", seed: int = 0,
                     curve: str = "dilaserve") -> Simulator:
    """A colocated Simulator of one layout (an instance per entry of `degrees`), not run yet."""
    insts = layout_instances(degrees, cost_for, config.page_size)
    uniform = len(set(degrees)) == 1
    cfg = config.replace(num_workers=len(insts), tensor_parallel_size=degrees[0] if uniform else 1)
    shape = MODELS[model]
    behaviour = ParametricBehaviour(model, seed, CURVES[curve][model])
    return Simulator(cfg, None, behaviour, shape.model_info(), logit_shift=shape.logit_shift,
                     costs=[i.cost for i in insts], pages=[i.num_pages for i in insts])


class SimRegroups:
    """The Reconfigurer's actuator and timer events in the simulator."""

    def __init__(self, sim: Simulator, cost_for, restart_s: float, schedule: list[tuple[float, list[int]]]):
        self.sim, self.cost_for, self.restart_s = sim, cost_for, restart_s
        self.schedule = sorted(schedule, key=lambda x: x[0])
        self.driver: Reconfigurer | None = None

    @property
    def active(self) -> bool:
        return self.driver.active is not None

    def stop(self, slot: int) -> None:
        self.sim.retire_worker(slot)
        self.driver.stopped(slot)

    def start(self, slot: int, devices: tuple[int, ...]) -> None:
        self.sim._push(self.sim.now + self.restart_s, REGROUP_DONE, slot, len(devices))

    def on_start(self) -> None:
        for k, (at, _) in enumerate(self.schedule):
            self.sim._push(at, RECONF, k)
        if not self.schedule:
            self.sim._push(self.sim.config.reconfigure_period_s, RECONF, None)

    def on_reconf(self, k) -> None:
        sim, driver = self.sim, self.driver
        if k is not None:
            degrees = self.schedule[k][1]
            if driver.active is None and sorted(degrees) != sorted(driver.layout.degrees()):
                driver.begin(degrees, "scheduled")
            return
        if sim.arrivals_left or sim.entries:               # the planner runs while there is work
            sim._push(sim.now + sim.config.reconfigure_period_s, RECONF, None)
        driver.plan()

    def on_ready(self, slot: int, degree: int) -> None:
        c = self.cost_for(degree)
        self.sim.install_worker(slot, c, c.kv_pool_tokens() // self.sim.wc.page_size)


def reconfigurer(sim: Simulator, cost_for, restart_s: float, heads: tuple[int, int], gpus_per_node: int = 8,
                 schedule: list[tuple[float, list[int]]] | None = None,
                 degrees: list[int] | None = None) -> Reconfigurer:
    """Attach the server's regroup driver to `sim`; `schedule` [(at_s, degrees)] replaces the planner."""
    glue = SimRegroups(sim, cost_for, restart_s, schedule or [])
    layout = Layout.of_degrees(degrees or [getattr(w.cost, "tp", 1) for w in sim.workers])
    glue.driver = Reconfigurer(sim.scheduler, glue, sim.clock, layout, heads, gpus_per_node)
    sim.regroup = glue
    return glue.driver
