"""The simulated worker's Stepper (worker/model_step.py's seam): no model. Which positions of each
row commit comes from a behaviour model (sim/behaviour.py), how long the forward takes from a cost
model (sim/cost.py); the real WorkerCore applies the result, so block ends, early stops, seats and
admissions are the core's own decisions."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..worker.core import iteration_load
from ..worker.model_step import StepResult
from ..worker.runner import fed_range


class SimStepper:
    def __init__(self, cache: str, lead: int, behaviour, cost, eos_id: int, fill_id: int):
        self.cache = cache
        self.lead = lead                  # positions fed before a block (runner.window_lead, as the real stepper)
        self.behaviour = behaviour
        self.cost = cost
        self.eos_id = eos_id
        self.fill_id = fill_id            # what a committed non-EOS position holds (any non-stop id)
        self.core = None                  # the WorkerCore it steps (its iteration_load is this step's)

    def fed_tokens(self, t, is_prefill: bool) -> int:
        a, b = fed_range(self.cache, is_prefill, t.start, t.end, t.canvas.numel(), self.lead)
        return b - a

    def run(self, prefills: list, decodes: list, layer_done: Callable | None) -> StepResult:
        """Commits as NumPy host arrays where the real stepper returns host tensors: WorkerCore
        reads either only through tolist(), and a simulated step then makes no tensor at all."""
        batch = prefills + decodes
        width = max(t.end - t.start for t in batch)
        commit = np.zeros((len(batch), width), dtype=bool)
        tokens = np.empty((len(batch), width), dtype=np.int64)
        tokens.fill(self.fill_id)
        commit_range, eos_id = self.behaviour.commit_range, self.eos_id
        for i, t in enumerate(batch):
            ranges, eos = commit_range(t)
            for lo, hi in ranges:
                commit[i, lo:hi] = True
            if eos is not None:
                tokens[i, eos] = eos_id
        if self.core is not None:        # WorkerCore.step sets `last` to these rows' load before it runs us
            load = self.core.last
        else:
            load = iteration_load(prefills, decodes, sum(self.fed_tokens(t, False) for t in decodes))
        return StepResult(commit, tokens, self.cost.forward_s(load))
