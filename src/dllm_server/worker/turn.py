"""One turn of a worker's pump: apply what the inbox held (one dispatch each), collect finished KV
transfers, run an iteration when there is work, and close the turn's batch with a load report.
The worker process (executor/worker_main.py) and the cluster simulator (sim/cluster.py) both take their
turns through this function, so a simulated worker decides exactly what a real one does; only
where the messages come from and how long the turn lasts differ."""
from __future__ import annotations

from typing import Callable

from ..messages import Shutdown
from .core import WorkerCore


def take_turn(core: WorkerCore, msgs: list, worker_id: int, num_iterations: int,
              turn_s: Callable[[bool], float], messages_handled: int = 0,
              heartbeat: bool = False) -> tuple[list, int] | None:
    """Returns (the batch to put out, empty when the turn did nothing, iterations run so far), or
    None on Shutdown. `turn_s(stepped)` is the turn's duration for its load report; it is asked
    last, once the iteration has run (the real pump measures, a simulator predicts). A
    `heartbeat` turn reports even with nothing to say, if work remains (the front's watchdog);
    `messages_handled` (inbox messages so far) goes in the report for the same reason."""
    out: list = []
    for m in msgs:
        if isinstance(m, Shutdown):
            return None
        out += core.handle(m)
    out += core.poll_transfers()
    stepped = core.has_work
    if stepped:
        out += core.step()
        num_iterations += 1
    if out or msgs or (heartbeat and core.has_work):
        out.append(core.load_report(worker_id, num_iterations, turn_s(stepped), messages_handled))
    return out, num_iterations
