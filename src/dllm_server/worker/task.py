"""A worker's per-request state and what one iteration feeds, shared by the core and the simulator."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..decoding.params import BlockPolicy, DecodeParams
from ..decoding.stop import AnswerMarks
from ..costmodel.iteration import IterationStats
from .kv_pool import PageAlloc

WAITING, PREFILL, READY, ACTIVE, HELD = "waiting", "prefill", "ready", "active", "held"


@dataclass(slots=True)
class BlockTask:
    """One request's canvas and current block. Phases: WAITING for a prefill, PREFILL when admitted, READY for a
    decode seat, ACTIVE in one, HELD after a handoff prefill until its KV is sent."""
    request_id: str
    block_index: int
    prompt_len: int
    params: DecodeParams
    policy: BlockPolicy
    marks: AnswerMarks
    arrival_seq: int
    canvas: torch.Tensor
    start: int
    end: int
    handoff: bool = False
    stream_to: int | None = None
    then: BlockPolicy | None = None     # the router's continuation: the next block runs here with it
    alloc: PageAlloc | None = None
    step: int = 0
    phase: str = WAITING
    cached_len: int = 0                 # block-causal: positions whose KV is in place
    finalise_from: int = -1             # block-causal: the previous block's start while its final KV is unwritten
    prefix_keys: list[bytes] | None = None
    prefix_hits: int = 0                # leading prefix_keys it references in the cache
    constraint_at: tuple | None = None  # structured output: (its automaton, block index, state at the block's start)
    post_steps: int = 0                 # token editing: forwards this block ran with no mask left in it

    @property
    def key(self) -> tuple[float, int, int, str]:
        return (self.policy.priority, self.arrival_seq, self.block_index, self.request_id)

    def next_block(self) -> None:
        self.block_index += 1
        self.finalise_from = self.start if self.params.block_causal else -1
        self.start, self.end = self.params.block_bounds(self.prompt_len, self.block_index)
        self.policy, self.then = self.then or self.policy, None    # no new lease: the policy stands
        self.step, self.phase, self.post_steps = 0, WAITING, 0


def iteration_load(prefills: list, decodes: list, decode_tokens: int) -> IterationStats:
    """The step-time model's features of one iteration (costmodel/step_time.py)."""
    prefill_tokens = prefill_sq = decode_keys = 0
    for t in prefills:
        if t.params.block_causal:
            n = t.end - t.cached_len
            prefill_tokens += n
            prefill_sq += n * t.end
        else:
            n = t.canvas.numel()
            prefill_tokens += n
            prefill_sq += n * n
    for t in decodes:
        decode_keys += t.end if t.params.block_causal else t.canvas.numel()
    return IterationStats(prefill_tokens, decode_tokens, decode_keys, prefill_sq, len(prefills), len(decodes))
