"""The simulated worker's Stepper: commits from a behaviour model, forward time from a cost model; the real
WorkerCore applies them, so block ends, stops and admissions stay the core's own decisions."""
from __future__ import annotations

from typing import Callable

from ..worker.core import iteration_load
from ..worker.model_step import StepResult, causal_fed_range
from ..worker.runner import fed_range


class SimStepper:
    def __init__(self, cache: str, lead: int, behaviour, cost, eos_id: int, fill_id: int):
        self.cache = cache
        self.lead = lead
        self.behaviour = behaviour
        self.cost = cost
        self.eos_id = eos_id
        self.fill_id = fill_id            # what a committed non-EOS position holds (any non-stop id)
        self.core = None

    def fed_tokens(self, t, is_prefill: bool) -> int:
        if t.params.block_causal:
            a, b = causal_fed_range(t, is_prefill, "fused")
        else:
            a, b = fed_range(self.cache, is_prefill, t.start, t.end, t.canvas.numel(), self.lead)
        return b - a

    def run(self, prefills: list, decodes: list, layer_done: Callable | None) -> StepResult:
        """Commits as plain lists (WorkerCore takes either): a simulated step makes no array at all."""
        batch = prefills + decodes
        width = max(t.end - t.start for t in batch)
        commit, tokens = [], []
        commit_range, eos_id, fill = self.behaviour.commit_range, self.eos_id, [self.fill_id] * width
        for t in batch:
            ranges, eos = commit_range(t)
            row = [False] * width
            for lo, hi in ranges:
                row[lo:hi] = (True,) * (hi - lo)
            commit.append(row)
            if eos is None:
                tokens.append(fill)                     # shared: the core only reads it
            else:
                toks = fill.copy()
                toks[eos] = eos_id
                tokens.append(toks)
        if self.core is not None:        # WorkerCore.step sets `last` to these rows' load first
            load = self.core.last
        else:
            load = iteration_load(prefills, decodes, sum(self.fed_tokens(t, False) for t in decodes))
        return StepResult(commit, tokens, self.cost.forward_s(load))
