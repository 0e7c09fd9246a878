"""The decode policy interface and the plain policies (the SLO-aware one is slo.py). A policy runs on the front
loop, so it must be cheap and never block; one that `observes` is fed every report, step and finish."""
from __future__ import annotations

from typing import Protocol

from ..decoding.canvas import effective_steps, steps_per_block
from ..decoding.params import BlockPolicy
from ..request.state import GenerationOutput, RequestState
from ..messages import BlockDone, LoadReport, StepDelta


class DecodePolicy(Protocol):
    observes: bool

    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy: ...

    def block_policies(self, items: list[tuple[RequestState, int]]) -> list[BlockPolicy]:
        ...

    def seed(self, worker_id: int, profile: tuple[tuple[float, ...], ...]) -> None: ...

    def on_report(self, worker_id: int, report: LoadReport, now: float) -> None: ...

    def on_block_done(self, state: RequestState, msg: BlockDone) -> None: ...

    def on_step(self, state: RequestState, delta: StepDelta, worker_id: int, now: float) -> None: ...

    def on_finish(self, state: RequestState, output: GenerationOutput, now: float) -> None: ...

    def revise(self, entries, now: float) -> list[tuple[str, int, BlockPolicy]]:
        """(request, block index, new policy) for running/queued or leased next blocks of `entries` (.state,
        .worker, .lease) to change. Called every scheduling tick; a policy rate-limits itself."""
        ...

    def is_hopeless(self, request_id: str) -> bool:
        """At its last decision no allowed threshold was predicted to meet the request's SLO."""
        ...


class StaticPolicy:
    """Decides from the request alone: no observations, no revisions."""
    observes = False

    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy:
        raise NotImplementedError

    def block_policies(self, items: list[tuple[RequestState, int]]) -> list[BlockPolicy]:
        return [self.block_policy(st, k) for st, k in items]

    def seed(self, worker_id: int, profile) -> None:
        pass

    def on_report(self, worker_id: int, report: LoadReport, now: float) -> None:
        pass

    def on_block_done(self, state: RequestState, msg: BlockDone) -> None:
        pass

    def on_step(self, state: RequestState, delta: StepDelta, worker_id: int, now: float) -> None:
        pass

    def on_finish(self, state: RequestState, output: GenerationOutput, now: float) -> None:
        pass

    def revise(self, entries, now: float) -> list[tuple[str, int, BlockPolicy]]:
        return []

    def is_hopeless(self, request_id: str) -> bool:
        return False


def request_rule(state: RequestState, block_index: int, default_threshold: float) -> BlockPolicy:
    """The request's own rule; fixed steps are split over the blocks as LLaDA does."""
    s = state.sampling
    steps = None if s.steps is None else steps_per_block(
        effective_steps(s.steps, state.params.max_tokens, state.params.block_length, state.prompt_len,
                        state.params.block_causal), state.num_blocks, block_index)
    return BlockPolicy(default_threshold if s.threshold is None else s.threshold, s.factor, steps, s.entropy_bound)


def names_a_rule(state: RequestState) -> bool:
    s = state.sampling
    return (s.threshold is not None or s.factor is not None or s.steps is not None
            or s.entropy_bound is not None)


class FixedPolicy(StaticPolicy):
    """Every block by the request's own rule, at the server's threshold when it names none."""

    def __init__(self, default_threshold: float):
        self.default_threshold = default_threshold

    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy:
        return request_rule(state, block_index, self.default_threshold)


class ThresholdSchedule(StaticPolicy):
    """Block k commits at thresholds[k] (the last for later blocks), whatever the request asked; for replays."""

    def __init__(self, thresholds: list[float]):
        if not thresholds:
            raise ValueError("thresholds: give at least one")
        self.thresholds = [BlockPolicy(float(t)) for t in thresholds]

    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy:
        return self.thresholds[min(block_index, len(self.thresholds) - 1)]
