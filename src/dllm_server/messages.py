"""Typed messages between the request side and a worker core: frozen plain data that pickles across process
queues. Workers report deltas, never whole sequences; the only whole-canvas payload is a SubmitBlock."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import WorkerPolicy
from .decoding.params import BlockPolicy, DecodeParams


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    worker_id: int
    role: str
    device: str
    num_threads: int
    model_path: str
    world_size: int           # > 1: join a torch.distributed group for KV transfer
    dist_port: int
    kv_peers: tuple[int, ...] = ()
    restarts: int = 0         # earlier processes of this worker id (test faults fire in the first)
    tp_rank: int = 0          # rank 0 leads: the worker the front knows
    tp_size: int = 1
    tp_port: int = 0
    dist_host: str = "127.0.0.1"   # the KV world's store (worker 0's node); tp_host: the instance's (its rank 0's)
    tp_host: str = "127.0.0.1"
    parent_pid: int = 0       # the front that spawned it (mp launch; 0: not its parent, as under Ray)
    kv_ranks: tuple[tuple[int, ...], ...] = ()    # world_size > 1: every worker's ranks in that world, leader first


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the front process needs to know of the model."""
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


@dataclass(frozen=True, slots=True)
class SubmitBlock:
    """Prefill (block 0) or re-prefill (block k) of one request: a full-canvas forward, then the block's steps."""
    request_id: str
    block_index: int
    prompt_len: int
    canvas: torch.Tensor              # int64 [canvas_len], CPU
    params: DecodeParams
    policy: BlockPolicy
    stop_token_ids: tuple[int, ...]
    arrival_seq: int                  # re-prefills keep their request's
    step_offset: int = 0              # steps this block already took elsewhere
    handoff: bool = False             # prefill only: the block decodes elsewhere
    stream_to: int | None = None      # stream KV to this worker during the prefill (else held until HandoffKV)
    then: BlockPolicy | None = None   # run the next block here, with this policy


@dataclass(frozen=True, slots=True)
class ContinueBlock:
    """A lease: when this block ends, the worker queues the next one itself with `then` (None withdraws it)."""
    request_id: str
    block_index: int
    then: BlockPolicy | None


@dataclass(frozen=True, slots=True)
class ReviseBlock:
    """A new commit rule for a block running or queued here; ignored once the request has moved on."""
    request_id: str
    block_index: int
    policy: BlockPolicy


@dataclass(frozen=True, slots=True)
class Evict:
    """A regroup drains this worker: give the block back if its full-canvas forward has not run."""
    request_id: str
    block_index: int


@dataclass(frozen=True, slots=True)
class SetPolicy:
    """Runtime scheduling knobs of a worker, applied at its next iteration."""
    policy: WorkerPolicy


@dataclass(frozen=True, slots=True)
class HandoffKV:
    """To a prefill worker: send the held KV of `request_id` to `dst_worker`."""
    request_id: str
    dst_worker: int


@dataclass(frozen=True, slots=True)
class ReceiveKV:
    """Relayed KVSent: post that group's receives in its order; keep[i] False receives and drops (request ended)."""
    src_worker: int
    request_ids: tuple[str, ...]
    block_indices: tuple[int, ...]
    canvas_lens: tuple[int, ...]
    keep: tuple[bool, ...]
    tag_base: int


@dataclass(frozen=True, slots=True)
class InstallKV:
    """To a decode worker, after ReceiveKV: decode this block once its KV is in."""
    block: SubmitBlock


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class StepDelta:
    request_id: str
    block_index: int
    step: int                         # 0 = the block's prefill forward
    positions: tuple[int, ...]        # absolute canvas positions
    token_ids: tuple[int, ...]
    num_masked: int                   # left in the answer after this step
    features: tuple[float, ...] = ()  # confidence summary of what is still masked
    logprobs: tuple = ()              # asked for: per token (logprob, ((alternative id, logprob), ...))
    constraint_ms: float = 0.0        # structured output: this step's dynamic program over the block (ms)


@dataclass(frozen=True, slots=True)
class Evicted:
    """The answer to Evict: `removed` when the block was still waiting; else it runs to its end here."""
    request_id: str
    block_index: int
    removed: bool


@dataclass(frozen=True, slots=True)
class BlockDone:
    request_id: str
    block_index: int
    num_steps: int                    # forwards, prefill included
    is_final: bool                    # the visible answer can no longer change
    continued: bool = False           # the next block is already queued on this worker
    policy: BlockPolicy | None = None


@dataclass(frozen=True, slots=True)
class RequestFailed:
    request_id: str
    message: str


@dataclass(frozen=True, slots=True)
class KVSent:
    """One group of KV sends (per layer, per request, K then V), emitted before the data flows so the receiver
    posts in the same order: NCCL matches point-to-point ops per pair by order, gloo by tag."""
    src_worker: int
    dst_worker: int
    request_ids: tuple[str, ...]
    block_indices: tuple[int, ...]
    canvas_lens: tuple[int, ...]
    tag_base: int


@dataclass(frozen=True, slots=True)
class PrefillDone:
    request_id: str
    block_index: int
    num_steps: int


@dataclass(frozen=True, slots=True)
class HandoffDone:
    """From both ends of a transfer; ok=False from the receiver (pages short) makes the engine re-prefill."""
    request_id: str
    block_index: int
    worker_id: int
    is_sender: bool
    ok: bool
    num_bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One per loop turn that did something: the worker's load and its last iteration (seconds, tokens)."""
    worker_id: int
    outstanding_prefill_tokens: int
    num_active_decodes: int
    free_pages: int                   # free, or cached and unreferenced (reclaimed on demand)
    deficit_tokens: int
    iteration_tokens: int             # prefill + decode
    num_iterations: int
    iteration_s: float = 0.0          # the whole loop turn (inbox, step, outbox)
    forward_s: float = 0.0
    prefill_tokens: int = 0
    num_prefills: int = 0
    policy: WorkerPolicy | None = None
    decode_keys: int = 0
    prefill_sq: int = 0               # sum of squared prefill canvas lengths (attention cost)
    busy: bool = False                # another report follows (the watchdog)
    messages_handled: int = 0
    prefix_cache: tuple[int, int, int, int] | None = None   # (hit, looked-up tokens, pages cached, evicted)


@dataclass(frozen=True, slots=True)
class RowInvariance:
    """The worker's self-check that its projections' rows are bitwise independent of the batch's row count."""
    holds: bool
    row_counts: tuple[int, ...]
    shapes: tuple[tuple[int, int], ...]  # projection (in, out) shapes checked
    failures: tuple[str, ...]
    num_failures: int
    seconds: float
    fixed_rows: int = 0


@dataclass(frozen=True, slots=True)
class WorkerReady:
    worker_id: int
    num_pages: int
    page_size: int
    model: ModelInfo
    profile: tuple[tuple[float, ...], ...] = ()   # (decode_tokens, decode_keys, prefill_tokens, prefill_sq, s)
    row_invariance: RowInvariance | None = None
    tp_size: int = 1
    rank_rss_mb: tuple[float, ...] = ()       # each rank's resident memory after loading
    rank_weights_mb: tuple[float, ...] = ()   # what loading its weights added to it


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    worker_id: int
    traceback: str
