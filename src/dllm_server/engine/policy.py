"""The front process's per-block decode policy: for every block of a request, the commit rule it
runs with (BlockPolicy), chosen when the block is routed. This is the seam for SLO-aware
thresholds; the policies here are the plain ones.

A policy is called on the front loop at each block boundary, so it must be cheap and must not
block; it sees the request's state (its user params, progress and stats so far).
"""
from __future__ import annotations

from typing import Protocol

from ..decoding.canvas import steps_per_block
from ..decoding.params import BlockPolicy
from .request_state import RequestState


class DecodePolicy(Protocol):
    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy: ...


class FixedPolicy:
    """Every block of a request commits by the request's own rule: its threshold (the server's
    when it gives none), its factor, or its fixed steps split over the blocks as LLaDA does."""

    def __init__(self, default_threshold: float):
        self.default_threshold = default_threshold

    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy:
        s = state.sampling
        steps = None if s.steps is None else steps_per_block(s.steps, state.num_blocks, block_index)
        threshold = self.default_threshold if s.threshold is None else s.threshold
        return BlockPolicy(threshold, s.factor, steps)


class ThresholdSchedule:
    """Block k commits with thresholds[k] (the last one for later blocks), whatever the request
    asked; for replaying or testing per-block decisions."""

    def __init__(self, thresholds: list[float]):
        if not thresholds:
            raise ValueError("thresholds: give at least one")
        self.thresholds = [BlockPolicy(float(t)) for t in thresholds]

    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy:
        return self.thresholds[min(block_index, len(self.thresholds) - 1)]
