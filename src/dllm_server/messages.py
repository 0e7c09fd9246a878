"""Typed messages between the request side (engine / offline LLM) and a worker core.

Frozen, slotted dataclasses of primitives, int tuples and CPU tensors, so they pickle across
torch.multiprocessing queues. Workers report deltas (what one step committed), never whole
sequences; the only whole-canvas payload is SubmitBlock, once per block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoding.params import SamplingParams


# ---- request side -> worker ----
@dataclass(frozen=True, slots=True)
class SubmitBlock:
    """Prefill (block 0) or re-prefill (block k) of one request: the worker runs the full-canvas
    forward, the block's first commit and then its in-block decode steps."""
    request_id: str
    block_index: int
    prompt_len: int
    canvas: torch.Tensor              # int64 [canvas_len], CPU
    params: SamplingParams            # resolved: threshold, block_length and seed are set
    stop_token_ids: tuple[int, ...]
    arrival_seq: int                  # request arrival order; re-prefills keep their request's


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


# ---- worker -> request side ----
@dataclass(frozen=True, slots=True)
class StepDelta:
    request_id: str
    block_index: int
    step: int                         # 0 = the block's prefill forward
    positions: tuple[int, ...]        # absolute canvas positions committed this step
    token_ids: tuple[int, ...]
    num_masked: int                   # masked positions left in the answer after this step


@dataclass(frozen=True, slots=True)
class BlockDone:
    request_id: str
    block_index: int
    num_steps: int                    # forwards this block took, prefill included
    is_final: bool                    # the visible answer can no longer change: request done


@dataclass(frozen=True, slots=True)
class RequestFailed:
    request_id: str
    message: str
