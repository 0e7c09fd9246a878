"""Packs one iteration's work into a single model forward and returns block logits; the only place that launches
device work. For Dream-style models (logit_shift 1) block position p is predicted from p - 1, so a cached window
starts one earlier (lead 1: dInfer) or at the block start (lead 0: Fast-dLLM, its first position committed)."""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch

from ..model.args import ModelArgs
from ..model.attention import AttentionBatch, SeqSpan
from ..model.backends import select_backend
from .cuda_graph import DecodeGraphs
from .kv_pool import KVPool, PageAlloc


class InstanceBroken(BaseException):
    """A tensor-parallel forward failed on the leader, whose followers may wait forever in a collective. A
    BaseException, so the core's per-request failure handling lets it end the process (the front restarts it)."""


@dataclass(slots=True)
class ForwardItem:
    canvas: torch.Tensor
    alloc: PageAlloc
    fed_start: int
    fed_end: int
    block_start: int          # logits wanted for [block_start, block_end)
    block_end: int
    kv_end: int | None = None # keys [0, kv_end) are attended (block-causal); None: the whole canvas


def fed_range(mode: str, is_prefill: bool, block_start: int, block_end: int, canvas_len: int,
              lead: int) -> tuple[int, int]:
    """Which canvas positions a step feeds, by cache mode; a cached step also feeds `lead` positions before it."""
    if is_prefill or mode == "none":
        return 0, canvas_len
    if mode == "prefix":
        return block_start - lead, canvas_len
    return block_start - lead, block_end


def window_lead(logit_shift: int, dream_decoding: str) -> int:
    """Positions before the block a cached step feeds: the logit shift under dInfer's shifted window, else none."""
    return logit_shift if dream_decoding == "shifted" else 0


def first_only(logit_shift: int, dream_decoding: str, cache: str) -> bool:
    """Whether a block's full forward commits only its first position (Fast-dLLM's Dream rule, with a cache)."""
    return logit_shift > 0 and dream_decoding == "fast_dllm" and cache != "none"


class ModelRunner:
    def __init__(self, model: torch.nn.Module, args: ModelArgs, pool: KVPool, device: torch.device,
                 causal: bool = False, attention_backend: str = "sdpa", decode_graphs: DecodeGraphs | None = None):
        self.model = model
        self.args = args
        self.pool = pool
        self.device = device
        self.causal = causal
        self.attention = select_backend(attention_backend, device, page_size=pool.page_size,
                                        num_heads=args.local_heads, num_kv_heads=args.local_kv_heads,
                                        head_dim=args.head_dim, dtype=pool.layers[0].k.dtype)
        self.graphs = decode_graphs
        self.plan_sink = None            # tensor-parallel leader: sends each forward's plan (worker/tp.py)

    @torch.inference_mode()
    def forward(self, items: list[ForwardItem], layer_done=None, decode_only: bool = False,
                logits: bool = True) -> torch.Tensor | None:
        """Float32 logits [len(items), max block width, vocab] on the device, zero past an item's block;
        `layer_done(kv)` runs after each layer's attention; `logits=False` (a TP follower) returns None."""
        if self.plan_sink is not None:
            try:
                self.plan_sink(items, decode_only, layer_done is not None)
                return self._forward(items, layer_done, decode_only, logits)
            except Exception as exc:
                raise InstanceBroken(f"tensor-parallel forward failed: {exc!r}") from exc
        return self._forward(items, layer_done, decode_only, logits)

    def _forward(self, items: list[ForwardItem], layer_done, decode_only: bool, logits: bool) -> torch.Tensor | None:
        if decode_only and self.graphs is not None and not self.causal and self.graphs.fits(items):
            out = self.graphs.run(items)
            return out if logits else None
        shift = self.args.logit_shift
        page = self.pool.page_size
        # int64 arrays, one tensor each: a few host ops per iteration instead of several per item
        pos, rows, slots = array("q"), array("q"), array("q")
        ids, seqs = [], []
        q_start = 0
        for it in items:
            n = it.fed_end - it.fed_start
            ids.append(it.canvas[it.fed_start:it.fed_end])
            fed = range(it.fed_start, it.fed_end)
            pos.extend(fed)
            a = it.alloc   # slots from the host page list: no device-to-host read of slot_ids
            if a.slot_ids is None:
                slots.extend(range(a.slot_base + it.fed_start, a.slot_base + it.fed_end))
            else:
                slots.extend(a.pages[p // page] * page + p % page for p in fed)
            first = q_start + (it.block_start - shift - it.fed_start)
            # clamped: a window fed from its block start predicts the first position from its own output
            if logits:
                rows.extend(max(r, q_start) for r in range(first, first + it.block_end - it.block_start))
            kv = it.canvas.numel() if it.kv_end is None else it.kv_end
            slot_ids = a.slot_ids if a.slot_ids is None or kv == a.slot_ids.numel() else a.slot_ids[:kv]
            seqs.append(SeqSpan(q_start, n, it.fed_start, kv, a.slot_base, slot_ids, a.pages[: -(-kv // page)]))
            q_start += n
        dev = lambda a: (torch.frombuffer(a, dtype=torch.int64) if len(a)  # noqa: E731
                         else torch.empty(0, dtype=torch.int64)).to(self.device)
        out = self.model(torch.cat(ids).to(self.device), dev(pos),
                         AttentionBatch(seqs, self.causal, self.attention, layer_done, dev(slots), self.args.block_size),
                         self.pool.layers, dev(rows))
        if not logits:
            return None
        logits = out[:, : self.args.vocab_size].float()
        widths = [it.block_end - it.block_start for it in items]
        width = max(widths)
        if min(widths) == width:
            return logits.reshape(len(items), width, -1)
        out = logits.new_zeros(len(items), width, logits.shape[-1])
        offset = 0
        for b, it in enumerate(items):
            k = it.block_end - it.block_start
            out[b, :k] = logits[offset: offset + k]
            offset += k
        return out
