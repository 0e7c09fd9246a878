"""One iteration's model work: the packed forward, then the commit rule per row. It decides nothing (WorkerCore
does); `Stepper` is the seam a simulator fills with a behaviour model instead of a forward."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ..config import WorkerConfig
from ..decoding.commit import CommitRow, EditInputs, commit_step, committed_logprobs
from ..model.args import ModelArgs
from ..structured.grammars import Grammars
from .cuda_graph import DecodeGraphs
from .kv_pool import KVPool
from .runner import ForwardItem, ModelRunner, fed_range, first_only, window_lead

log = logging.getLogger(__name__)


class StepBlock(Protocol):
    """What a step needs of a block (worker/task.py BlockTask)."""
    canvas: torch.Tensor
    start: int
    end: int
    step: int
    block_index: int
    alloc: object
    cached_len: int
    finalise_from: int
    params: object
    policy: object
    prompt_len: int
    marks: object
    constraint_at: tuple | None


@dataclass(slots=True)
class StepResult:
    commit: torch.Tensor | list   # bool [B, K] on the host, block-relative; or row lists (the simulator)
    tokens: torch.Tensor | list   # int64 [B, K] on the host, or row lists
    forward_s: float
    summary: torch.Tensor | None = None   # float64 [B, F] on the host: confidence_summary per block
    logprobs: dict | None = None          # row -> its committed_logprobs, for the rows that asked
    constraint_ms: dict | None = None     # row -> its structured-output dynamic program's time (ms)


class Stepper(Protocol):
    def fed_tokens(self, t: StepBlock, is_prefill: bool) -> int: ...

    def run(self, prefills: list, decodes: list, layer_done: Callable | None) -> StepResult: ...


class _ForwardTimer:
    """Forward time; on CUDA from events read after the host copy synchronised (launches return early)."""

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
    """What a block-causal step feeds (docs/block_causal.md); a block's first forward also writes the previous
    block's final tokens unless `finalise` is "separate" (their own forward first, in ModelStepper.run)."""
    if is_prefill:
        return t.cached_len, t.end
    if t.step == 0 and t.finalise_from >= 0 and finalise != "separate":
        return (0 if finalise == "recompute" else t.finalise_from), t.end
    return t.start, t.end


def uses_decode_graphs(device: torch.device, config: WorkerConfig, args: ModelArgs) -> bool:
    """CUDA graphs for decode-only iterations, except where a forward syncs with the host: the torch MoE layer reads
    its per-expert row counts (moe.SparseMoE.routed), which a capture cannot hold."""
    if device.type != "cuda" or config.enforce_eager or config.hooks.causal:
        return False
    if args.moe is not None:
        log.info("mixture of experts: decode iterations run eagerly (the grouped MoE reads its expert counts)")
        return False
    return True


def edit_inputs(batch: list, current: torch.Tensor, masked: torch.Tensor) -> EditInputs:
    """For editing rows, which positions may be rewritten: filled answer positions (a block-causal block may start
    inside the prompt, which is never edited)."""
    editable = torch.zeros(masked.shape, dtype=torch.bool)
    for i, t in enumerate(batch):
        if t.params.editing:
            editable[i, max(0, t.prompt_len - t.start):t.end - t.start] = True
    return EditInputs(current, editable & ~masked)


class ModelStepper:
    def __init__(self, config: WorkerConfig, model: torch.nn.Module, args: ModelArgs, pool: KVPool,
                 device: torch.device):
        self.config = config
        self.args = args
        self.lead = window_lead(args.logit_shift, config.dream_decoding)
        self.first_only = first_only(args.logit_shift, config.dream_decoding, config.cache)
        graphs = None
        if uses_decode_graphs(device, config, args):
            graphs = DecodeGraphs(model, args, pool, device, config.policy.max_active_decodes, capture=True,
                                  lead=self.lead)
            t0 = time.perf_counter()
            n = graphs.capture_all(config.block_length)
            log.info("captured %d decode CUDA graphs in %.1f s (%.2f GiB reserved)", n,
                     time.perf_counter() - t0, torch.cuda.memory_reserved(device) / 2**30)
        self.num_forwards = 0          # model forwards run (a separate finalise counts its own)
        self.weights_rss_mb = 0.0      # what loading the weights added to the process (worker/build.py)
        self.grammar_folder: str | None = None   # the checkpoint, for structured output's automata
        self._grammars: Grammars | None = None
        self.runner = ModelRunner(model, args, pool, device, causal=config.hooks.causal,
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
        if self.config.block_causal_finalise == "separate":
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
        if all(b.numel() == logits.shape[1] for b in blocks):
            current = torch.stack(blocks)
        else:
            current = torch.full((len(batch), logits.shape[1]), -1, dtype=torch.int64)    # -1: padding, never masked
            for i, b in enumerate(blocks):
                current[i, : b.numel()] = b
        masked = current == mask_id
        # Fast-dLLM's Dream rule, only while the first position is open (a re-prefill may find it committed)
        n_pre = len(prefills)
        rows = [CommitRow(t.end - t.start, t.params, t.policy, t.block_index, t.step,
                          self.first_only and i < n_pre and bool(masked[i, 0]), self._constraint(t))
                for i, t in enumerate(batch)]
        constrained = [i for i, r in enumerate(rows) if r.constraint is not None]
        out = commit_step(logits, masked, rows, mask_id, self.config.step_candidates,
                          edit_inputs(batch, current, masked) if any(t.params.editing for t in batch) else None)
        lps = committed_logprobs(logits, out[1], rows, mask_id) if any(r.params.logprobs is not None
                                                                         for r in rows) else None
        dp_ms = {i: rows[i].constraint.elapsed_ms for i in constrained} if constrained else None
        return StepResult(*out[:2], timer.seconds(), out[2] if len(out) > 2 else None, lps, dp_ms)   # timer after the copy

    def _constraint(self, t: StepBlock):
        """Structured output: this block's RowConstraint (the automaton compiled once per regex here)."""
        regex = t.params.constraint
        if regex is None:
            return None
        if self._grammars is None:
            self._grammars = Grammars(self.grammar_folder, tuple(t.marks.stops), self.args.vocab_size)
        row, t.constraint_at = self._grammars.row(regex, t.marks.answer, t.prompt_len, t.start, t.end,
                                                  t.params.max_tokens, t.canvas[t.start:t.end].tolist(),
                                                  self.args.mask_id, t.constraint_at, t.block_index)
        return row
