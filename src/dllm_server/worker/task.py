"""A worker's per-request state (BlockTask, its phases) and what one iteration feeds
(iteration_load: the step-time model's features), shared by the core and the simulator."""
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
    """Worker-local state of one request: its canvas and its current block. Phases: WAITING for the
    block's full-canvas forward, PREFILL while admitted to it, READY (prefilled) for a decode seat,
    ACTIVE in a seat, HELD after a handoff prefill until its KV is sent."""
    request_id: str
    block_index: int
    prompt_len: int
    params: DecodeParams
    policy: BlockPolicy
    marks: AnswerMarks                # the answer's masks and stop tokens, beside the canvas
    arrival_seq: int
    canvas: torch.Tensor
    start: int
    end: int
    handoff: bool = False
    stream_to: int | None = None
    then: BlockPolicy | None = None     # the router's continuation: run the next block here with it
    alloc: PageAlloc | None = None
    step: int = 0                       # forwards done in this block
    phase: str = WAITING
    cached_len: int = 0                 # block-causal: positions whose KV is in place (prefix cache)
    finalise_from: int = -1             # block-causal: the previous block's start while its final KV is unwritten
    prefix_keys: list[bytes] | None = None   # prefix cache: its prompt units' keys (worker/prefix_cache.py)
    prefix_hits: int = 0                # of which cached ones it references

    @property
    def key(self) -> tuple[int, int, str]:
        return (self.arrival_seq, self.block_index, self.request_id)

    def next_block(self) -> None:
        self.block_index += 1
        self.finalise_from = self.start if self.params.block_causal else -1
        self.start, self.end = self.params.block_bounds(self.prompt_len, self.block_index)
        self.policy, self.then = self.then or self.policy, None    # block-causal: a standing lease
        self.step, self.phase = 0, WAITING


def iteration_load(prefills: list, decodes: list, decode_tokens: int) -> IterationStats:
    """What one iteration feeds (the step-time model's features, costmodel/step_time.py): a prefill
    feeds its whole canvas and attends over it (squared), a decode its fed tokens against the
    canvas's keys (a block-causal one: the positions it feeds against the keys up to its block's
    end, nothing after it). Pure; the core and the simulator's stepper both describe an iteration
    with it."""
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
