"""Attention over a packed batch of sequences with paged KV. Each sequence feeds canvas positions [pos_start,
pos_start + q_len), writes their K/V to its cache slots, then attends over keys [0, kv_len): one rule for prefill,
block steps with dual or prefix cache, and the no-cache reference. `block_size` B > 0 (SDAR): a query at p sees key k
iff k // B <= p // B; B = 0 builds no mask."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class SeqSpan:
    """One sequence of a packed forward."""
    q_start: int           # offset of its first query row in the packed token stream
    q_len: int
    pos_start: int
    kv_len: int
    slot_base: int         # >= 0: the canvas lives in contiguous slots [base, base + kv_len)
    slot_ids: torch.Tensor | None  # otherwise the slot of every canvas position (int64 [kv_len])
    pages: list[int] | None = None # its pages in canvas order, when known on the host (FlashInfer plan)


AttentionFn = Callable[..., torch.Tensor]   # (q, k, v, layer_kv, batch) -> out, see sdpa_attention


@dataclass(slots=True)
class AttentionBatch:
    """Per-forward attention metadata; `backend` is what every layer calls (select_backend)."""
    seqs: list[SeqSpan]
    causal: bool = False   # test-only oracle: query at p sees keys <= p
    backend: AttentionFn | None = None
    layer_done: Callable[[LayerKV], None] | None = None
    fed_slots: torch.Tensor | None = None   # int64 [T]: cache slot of every packed fed token
    block_size: int = 0


@dataclass(slots=True)
class DenseBatch:
    """No cache: `num_seqs` equal-length sequences packed back to back (training and reference forwards)."""
    num_seqs: int
    causal: bool = False
    block_size: int = 0


@dataclass(slots=True)
class PaddedBatch:
    """Decode-only: fixed shapes, no host control flow, so a CUDA graph can capture it (worker/cuda_graph.py)."""
    num_seqs: int
    q_len: int
    write_slots: torch.Tensor   # int64 [num_seqs * q_len]: cache slot of every fed token
    kv_slots: torch.Tensor      # int64 [num_seqs, K]: cache slot of every key (padding: a scratch slot)
    kv_valid: torch.Tensor


@dataclass(slots=True)
class LayerKV:
    k: torch.Tensor  # [num_slots, n_kv_heads, head_dim]
    v: torch.Tensor


def _write(cache: torch.Tensor, seq: SeqSpan, fresh: torch.Tensor) -> None:
    lo, hi = seq.pos_start, seq.pos_start + seq.q_len
    if seq.slot_ids is None:
        cache[seq.slot_base + lo: seq.slot_base + hi] = fresh
    else:
        cache.index_copy_(0, seq.slot_ids[lo:hi], fresh)


def _read(cache: torch.Tensor, seq: SeqSpan) -> torch.Tensor:
    if seq.slot_ids is None:
        return cache[seq.slot_base: seq.slot_base + seq.kv_len]
    return cache.index_select(0, seq.slot_ids)


def block_causal_mask(pos_start: int, q_len: int, kv_len: int, block_size: int,
                      device: torch.device) -> torch.Tensor:
    """bool [q_len, kv_len]: may the query at pos_start + i see key j."""
    qblock = torch.arange(pos_start, pos_start + q_len, device=device).div_(block_size, rounding_mode="floor")
    kblock = torch.arange(kv_len, device=device).div_(block_size, rounding_mode="floor")
    return kblock.unsqueeze(0) <= qblock.unsqueeze(1)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: DenseBatch) -> torch.Tensor:
    b = batch.num_seqs
    shape = lambda x: x.view(b, -1, *x.shape[1:]).transpose(1, 2)
    mask = None
    if batch.block_size and not batch.causal:
        n = q.shape[0] // b
        mask = block_causal_mask(0, n, n, batch.block_size, q.device)
    o = F.scaled_dot_product_attention(shape(q), shape(k), shape(v), attn_mask=mask, is_causal=batch.causal,
                                       enable_gqa=True)
    return o.transpose(1, 2).reshape(q.shape)


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: LayerKV,
                     batch: PaddedBatch) -> torch.Tensor:
    """One batched SDPA call over keys gathered to a common length (invalid ones masked)."""
    b, w = batch.num_seqs, batch.q_len
    kv.k.index_copy_(0, batch.write_slots, k)
    kv.v.index_copy_(0, batch.write_slots, v)
    keys, values = kv.k[batch.kv_slots].transpose(1, 2), kv.v[batch.kv_slots].transpose(1, 2)
    o = F.scaled_dot_product_attention(q.view(b, w, *q.shape[1:]).transpose(1, 2), keys, values,
                                       attn_mask=batch.kv_valid[:, None, None, :], enable_gqa=True)
    return o.transpose(1, 2).reshape(q.shape)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: LayerKV | None,
           batch: AttentionBatch | DenseBatch | PaddedBatch) -> torch.Tensor:
    """What every layer calls: q [T, H, D], k/v [T, Hkv, D] for the packed fed tokens -> [T, H, D]."""
    if isinstance(batch, DenseBatch):
        return dense_attention(q, k, v, batch)
    if isinstance(batch, PaddedBatch):
        return padded_attention(q, k, v, kv, batch)
    out = (batch.backend or sdpa_attention)(q, k, v, kv, batch)
    if batch.layer_done is not None:
        batch.layer_done(kv)
    return out


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: LayerKV,
                   batch: AttentionBatch) -> torch.Tensor:
    """The paged SDPA backend: one call per sequence, faster on CPU than padding keys (docs/benchmarks.md §8)."""
    out = torch.empty_like(q)
    write_fresh_kv(kv, batch, k, v)
    for seq in batch.seqs:
        rows = slice(seq.q_start, seq.q_start + seq.q_len)
        if seq.pos_start == 0 and seq.q_len == seq.kv_len:
            keys, values = k[rows], v[rows]
        else:
            keys, values = _read(kv.k, seq), _read(kv.v, seq)
        mask = None
        if batch.causal:
            qpos = torch.arange(seq.pos_start, seq.pos_start + seq.q_len, device=q.device).unsqueeze(1)
            mask = torch.arange(seq.kv_len, device=q.device).unsqueeze(0) <= qpos
        elif batch.block_size:
            mask = block_causal_mask(seq.pos_start, seq.q_len, seq.kv_len, batch.block_size, q.device)
        o = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0), attn_mask=mask, enable_gqa=True)
        out[rows] = o.squeeze(0).transpose(0, 1)
    return out


def write_fresh_kv(kv: LayerKV, batch: AttentionBatch, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store every sequence's fed K/V in its cache slots (what each backend does first)."""
    if batch.fed_slots is not None:
        kv.k.index_copy_(0, batch.fed_slots, k)
        kv.v.index_copy_(0, batch.fed_slots, v)
        return
    for seq in batch.seqs:
        rows = slice(seq.q_start, seq.q_start + seq.q_len)
        _write(kv.k, seq, k[rows])
        _write(kv.v, seq, v[rows])
