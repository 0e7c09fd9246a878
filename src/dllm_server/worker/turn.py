"""One turn of a worker's pump; the worker process and the cluster simulator both take their turns through it, so a
simulated worker decides exactly what a real one does."""
from __future__ import annotations

from typing import Callable

from ..messages import Shutdown
from .core import WorkerCore


def take_turn(core: WorkerCore, msgs: list, worker_id: int, num_iterations: int,
              turn_s: Callable[[bool], float], messages_handled: int = 0,
              heartbeat: bool = False) -> tuple[list, int] | None:
    """(messages to put out, iterations so far), or None on Shutdown. `turn_s(stepped)` is asked after the
    iteration; a `heartbeat` turn reports while work remains even with nothing to say (the front's watchdog)."""
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
