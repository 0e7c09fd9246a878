"""Typed messages between the request side (engine / offline LLM) and a worker core.

Frozen, slotted dataclasses of primitives, int tuples and CPU tensors, so they pickle across
torch.multiprocessing queues. Workers report deltas (what one step committed), never whole
sequences; the only whole-canvas payload is SubmitBlock, once per block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoding.params import SamplingParams
from .model.args import ModelArgs


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
    step_offset: int = 0              # steps this block already took elsewhere (retry after a failed handoff)
    handoff: bool = False             # prefill only: the block decodes elsewhere (PrefillDone), not here
    stream_to: int | None = None      # handoff: send the KV to this decode worker layer by layer during
                                      # the prefill forward (else it is held until HandoffKV)


@dataclass(frozen=True, slots=True)
class HandoffKV:
    """To a prefill worker: send the held KV of `request_id` to `dst_worker` (torch.distributed)."""
    request_id: str
    dst_worker: int


@dataclass(frozen=True, slots=True)
class ReceiveKV:
    """To a decode worker, relayed from the sender's KVSent: post the receives of that group, in
    its order. keep[i] False: the request has ended; receive and drop (the sender sends anyway)."""
    src_worker: int
    request_ids: tuple[str, ...]
    block_indices: tuple[int, ...]
    canvas_lens: tuple[int, ...]
    keep: tuple[bool, ...]
    tag_base: int


@dataclass(frozen=True, slots=True)
class InstallKV:
    """To a decode worker, after ReceiveKV: decode this block once its KV is in."""
    block: SubmitBlock                # canvas as of the prefill's first commit; step_offset set


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


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


@dataclass(frozen=True, slots=True)
class KVSent:
    """A sender issued one group of KV sends to `dst_worker`: for each layer, for each request in
    order, K then V (tag = tag_base + 2 * (layer * len(group) + i) + kv). Emitted before the data
    flows, so the engine can relay it (ReceiveKV) and the receiver posts in the same order: NCCL
    matches point-to-point operations per pair by order, gloo by tag."""
    src_worker: int
    dst_worker: int
    request_ids: tuple[str, ...]
    block_indices: tuple[int, ...]
    canvas_lens: tuple[int, ...]
    tag_base: int


@dataclass(frozen=True, slots=True)
class PrefillDone:
    """A handoff block finished its prefill step (its KV streams or waits for HandoffKV)."""
    request_id: str
    block_index: int
    num_steps: int


@dataclass(frozen=True, slots=True)
class HandoffDone:
    """Sent by both ends of a transfer. ok=False on the receiver means its pages were short
    (the data was drained); the engine then falls back to a re-prefill."""
    request_id: str
    block_index: int
    worker_id: int
    is_sender: bool
    ok: bool
    num_bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class LoadReport:
    worker_id: int
    outstanding_prefill_tokens: int
    num_active_decodes: int
    free_pages: int
    deficit_tokens: int
    iteration_tokens: int             # tokens the last iteration fed (prefill + decode)
    num_iterations: int
    iteration_s: float = 0.0          # last iteration, whole loop turn (inbox, step, outbox)
    forward_s: float = 0.0            # of which the model forward


@dataclass(frozen=True, slots=True)
class WorkerReady:
    worker_id: int
    num_pages: int
    page_size: int
    model_args: ModelArgs
    pid: int


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    worker_id: int
    traceback: str
