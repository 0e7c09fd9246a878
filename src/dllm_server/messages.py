"""Typed messages between the request side (engine / offline LLM) and a worker core.

Plain data: frozen, slotted dataclasses of primitives, int tuples, CPU tensors and the small
frozen records of config.py and decoding/params.py, so they pickle across torch.multiprocessing
queues (tests/test_messages.py round-trips every one). Workers report deltas (what one step
committed), never whole sequences; the only whole-canvas payload is a SubmitBlock, sent when a
block starts on a worker that does not hold the request's canvas.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import WorkerPolicy
from .decoding.params import BlockPolicy, DecodeParams


# ---- process set-up ----
@dataclass(frozen=True, slots=True)
class WorkerSpec:
    worker_id: int
    role: str                 # "colocated" | "prefill" | "decode"
    device: str
    num_threads: int
    model_path: str
    world_size: int           # > 1: join a torch.distributed group for KV transfer
    dist_port: int
    kv_peers: tuple[int, ...] = ()   # workers this one sends KV to or receives KV from
    restarts: int = 0         # processes this worker id had before this one (test faults fire in the first)
    tp_rank: int = 0          # its rank in its tensor-parallel instance (0 leads: the worker the front knows)
    tp_size: int = 1
    tp_port: int = 0          # the instance's own torch.distributed rendezvous
    dist_host: str = "127.0.0.1"   # where the KV world's store lives (worker 0's node: the ray backend)
    tp_host: str = "127.0.0.1"     # where the instance's store lives (its rank 0's node)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the front process needs to know of the model (validation, limits, benchmarks)."""
    arch: str
    vocab_size: int
    embedding_size: int
    mask_id: int
    eos_id: int
    max_len: int
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_hidden: int
    block_size: int = 0           # > 0: a block-causal family, decoded on its own blocks of this size


# ---- request side -> worker ----
@dataclass(frozen=True, slots=True)
class SubmitBlock:
    """Prefill (block 0) or re-prefill (block k) of one request: the worker runs the full-canvas
    forward, the block's first commit and then its in-block decode steps."""
    request_id: str
    block_index: int
    prompt_len: int
    canvas: torch.Tensor              # int64 [canvas_len], CPU
    params: DecodeParams              # request-wide: sampler, seed, block width
    policy: BlockPolicy               # this block's commit rule
    stop_token_ids: tuple[int, ...]
    arrival_seq: int                  # request arrival order; re-prefills keep their request's
    step_offset: int = 0              # steps this block already took elsewhere (retry after a failed handoff)
    handoff: bool = False             # prefill only: the block decodes elsewhere (PrefillDone), not here
    stream_to: int | None = None      # handoff: send the KV to this decode worker layer by layer during
                                      # the prefill forward (else it is held until HandoffKV)
    then: BlockPolicy | None = None   # continue: run the next block here, with this policy (ContinueBlock)


@dataclass(frozen=True, slots=True)
class ContinueBlock:
    """The router keeps the request here: when block `block_index` ends with more to decode, the
    worker queues the next block's re-prefill itself, from its own canvas and pages, with policy
    `then` (None withdraws the lease: the block's end goes back to the router)."""
    request_id: str
    block_index: int
    then: BlockPolicy | None


@dataclass(frozen=True, slots=True)
class ReviseBlock:
    """The decode policy re-decided the commit rule of a block that runs (or waits to run) here:
    its next forwards use `policy`. Ignored when the request has moved on to another block."""
    request_id: str
    block_index: int
    policy: BlockPolicy


@dataclass(frozen=True, slots=True)
class Evict:
    """A regroup drains this worker: give back block `block_index` of the request if it has not
    started (its full-canvas forward not yet run), so it can run elsewhere (cluster/regroup.py)."""
    request_id: str
    block_index: int


@dataclass(frozen=True, slots=True)
class SetPolicy:
    """Runtime scheduling knobs of a worker, applied at its next iteration."""
    policy: WorkerPolicy


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
    features: tuple[float, ...] = ()  # SLO policy / traces: confidence summary of what is still masked


@dataclass(frozen=True, slots=True)
class Evicted:
    """The answer to Evict: `removed` when the block was still waiting (its pages freed, nothing
    run); otherwise it runs to its end here as usual."""
    request_id: str
    block_index: int
    removed: bool


@dataclass(frozen=True, slots=True)
class BlockDone:
    request_id: str
    block_index: int
    num_steps: int                    # forwards this block took, prefill included
    is_final: bool                    # the visible answer can no longer change: request done
    continued: bool = False           # the next block is already queued on this worker (ContinueBlock)
    policy: BlockPolicy | None = None  # the commit rule this block ran with


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
    """One per loop turn that did something: the worker's load and its last iteration."""
    worker_id: int
    outstanding_prefill_tokens: int
    num_active_decodes: int
    free_pages: int                   # free, or cached and unreferenced (reclaimed on demand)
    deficit_tokens: int
    iteration_tokens: int             # tokens the last iteration fed (prefill + decode)
    num_iterations: int
    iteration_s: float = 0.0          # last iteration, whole loop turn (inbox, step, outbox)
    forward_s: float = 0.0            # of which the model forward
    prefill_tokens: int = 0           # of iteration_tokens: full-canvas forwards admitted
    num_prefills: int = 0
    policy: WorkerPolicy | None = None   # in effect for that iteration
    decode_keys: int = 0              # key positions the iteration's decodes attended to
    prefill_sq: int = 0               # sum of its prefills' squared canvas lengths (attention cost)
    busy: bool = False                # work left after this turn: another report follows (the watchdog)
    messages_handled: int = 0         # inbox messages handled since the worker started (the watchdog)
    prefix_cache: tuple[int, int, int, int] | None = None   # block-causal prefix cache since start: hit
    #                                   tokens, looked-up tokens, pages cached now, pages evicted


@dataclass(frozen=True, slots=True)
class RowInvariance:
    """The worker's batch-invariance self-check (worker/determinism.py): whether its projections'
    rows are bitwise independent of the call's row count, at the row counts it runs."""
    holds: bool
    row_counts: tuple[int, ...]          # checked
    shapes: tuple[tuple[int, int], ...]  # projection (in, out) shapes checked
    failures: tuple[str, ...]            # the first few, "in->out: r of n rows"
    num_failures: int
    seconds: float
    fixed_rows: int = 0                  # ServerConfig.fixed_matmul_rows in force (0: off)


@dataclass(frozen=True, slots=True)
class WorkerReady:
    worker_id: int
    num_pages: int
    page_size: int
    model: ModelInfo
    profile: tuple[tuple[float, ...], ...] = ()   # start-up iterations: (decode_tokens, decode_keys,
                                                  # prefill_tokens, prefill_sq, seconds)
    row_invariance: RowInvariance | None = None
    tp_size: int = 1                      # ranks of this instance
    rank_rss_mb: tuple[float, ...] = ()   # each rank's resident memory after loading its weights


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    worker_id: int
    traceback: str
