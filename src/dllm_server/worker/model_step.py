"""One iteration's model work: the packed forward of every admitted prefill and seated decode, then
the commit rule per row. WorkerCore decides *what* runs; this decides nothing and only computes.
It is the seam a simulator replaces (a behaviour model instead of a forward): `run` takes the
blocks and returns, per block, which positions commit and to which tokens.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ..config import WorkerConfig
from ..decoding.commit import CommitRow, commit_step
from ..model.args import ModelArgs
from .cuda_graph import DecodeGraphs
from .kv_pool import KVPool
from .runner import ForwardItem, ModelRunner, fed_range, first_only, window_lead

log = logging.getLogger(__name__)


class StepBlock(Protocol):
    """What a step needs of a block (worker/core.py BlockTask)."""
    canvas: torch.Tensor
    start: int
    end: int
    step: int
    block_index: int
    alloc: object
    cached_len: int               # positions whose KV is in place before the first forward (prefix cache)
    finalise_from: int            # >= 0: the previous block's start, its final tokens not yet fed
    params: object
    policy: object


@dataclass(slots=True)
class StepResult:
    commit: torch.Tensor | list   # bool [B, K], host: positions committed per block (block-relative);
    tokens: torch.Tensor | list   # int64 [B, K], host. Row lists serve too (the simulator's stepper)
    forward_s: float
    summary: torch.Tensor | None = None   # float64 [B, F], host: confidence_summary per block


class Stepper(Protocol):
    def fed_tokens(self, t: StepBlock, is_prefill: bool) -> int: ...

    def run(self, prefills: list, decodes: list, layer_done: Callable | None) -> StepResult: ...


class _ForwardTimer:
    """Wall time of the forward on the CPU; on CUDA, device time between two events (the launch
    returns before the kernels run), read once the step's copy to the host has synchronised."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.t1 = time.perf_counter()

    def seconds(self) -> float:
        return self.start.elapsed_time(self.end) / 1e3 if self.cuda else self.t1 - self.t0


def causal_fed_range(t: StepBlock, is_prefill: bool, finalise: str) -> tuple[int, int]:
    """What a block-causal step feeds (its keys end at the block's end: nothing later is seen):
    a request's first forward every position from the first one without KV (past a prefix-cache
    hit) to its block's end; a block's first forward after the previous block ended also that
    block's final tokens, so their KV is written once, in the same forward ("fused": exact, one
    forward a block saved; "recompute": the whole prefix again, the no-cache reference;
    "separate": a forward of their own first, ModelStepper.run); any other step the block alone."""
    if is_prefill:
        return t.cached_len, t.end
    if t.step == 0 and t.finalise_from >= 0 and finalise != "separate":
        return (0 if finalise == "recompute" else t.finalise_from), t.end
    return t.start, t.end


class ModelStepper:
    def __init__(self, config: WorkerConfig, model: torch.nn.Module, args: ModelArgs, pool: KVPool,
                 device: torch.device):
        self.config = config
        self.args = args
        self.lead = window_lead(args.logit_shift, config.dream_decoding)
        self.first_only = first_only(args.logit_shift, config.dream_decoding, config.cache)
        graphs = None
        if device.type == "cuda" and not config.enforce_eager and not config.causal:
            graphs = DecodeGraphs(model, args, pool, device, config.policy.max_active_decodes, capture=True,
                                  lead=self.lead)
            t0 = time.perf_counter()
            n = graphs.capture_all(config.block_length)
            log.info("captured %d decode CUDA graphs in %.1f s (%.2f GiB reserved)", n,
                     time.perf_counter() - t0, torch.cuda.memory_reserved(device) / 2**30)
        self.num_forwards = 0          # model forwards run (a separate finalise counts its own)
        self.runner = ModelRunner(model, args, pool, device, causal=config.causal,
                                  attention_backend=config.attention_backend, decode_graphs=graphs)

    def _range(self, t: StepBlock, is_prefill: bool) -> tuple[int, int]:
        if t.params.block_causal:
            return causal_fed_range(t, is_prefill, self.config.block_causal_finalise)
        return fed_range(self.config.cache, is_prefill, t.start, t.end, t.canvas.numel(), self.lead)

    def _item(self, t: StepBlock, is_prefill: bool) -> ForwardItem:
        a, b = self._range(t, is_prefill)
        return ForwardItem(t.canvas, t.alloc, a, b, t.start, t.end, t.end if t.params.block_causal else None)

    def fed_tokens(self, t: StepBlock, is_prefill: bool) -> int:
        a, b = self._range(t, is_prefill)
        return b - a

    def run(self, prefills: list, decodes: list, layer_done: Callable | None) -> StepResult:
        batch = prefills + decodes
        items = [self._item(t, True) for t in prefills] + [self._item(t, False) for t in decodes]
        timer = _ForwardTimer(self.runner.device)
        if self.config.block_causal_finalise == "separate":     # the unfused reference: a forward more
            final = [ForwardItem(t.canvas, t.alloc, t.finalise_from, t.start, t.start, t.start, t.start)
                     for t in decodes if t.params.block_causal and t.step == 0 and t.finalise_from >= 0]
            if final:
                self.runner.forward(final, logits=False)
                self.num_forwards += 1
        self.num_forwards += 1
        logits = self.runner.forward(items, layer_done=layer_done, decode_only=not prefills)
        timer.stop()
        mask_id = self.args.mask_id
        blocks = [t.canvas[t.start:t.end] for t in batch]
        if all(b.numel() == logits.shape[1] for b in blocks):        # one block width: one compare
            masked = torch.stack(blocks) == mask_id
        else:
            masked = torch.zeros(len(batch), logits.shape[1], dtype=torch.bool)
            for i, b in enumerate(blocks):
                masked[i, : b.numel()] = b == mask_id
        # Fast-dLLM's Dream rule on a block's full forward while its first position is open (a
        # re-prefill after a failed handoff finds it committed already)
        n_pre = len(prefills)
        rows = [CommitRow(t.end - t.start, t.params, t.policy, t.block_index, t.step,
                          self.first_only and i < n_pre and bool(masked[i, 0])) for i, t in enumerate(batch)]
        out = commit_step(logits, masked, rows, mask_id, self.config.step_candidates)
        return StepResult(*out[:2], timer.seconds(), out[2] if len(out) > 2 else None)   # timer read after the copy
