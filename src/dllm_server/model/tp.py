"""Megatron-style tensor parallelism as a transform of a built model (as gpt-fast's tp.py), so model files read the
same at TP=1. A rank keeps its heads of Q/K/V (split before fusing: a cut of fused Q|K|V would mix Q rows into K), its
rows of gate/up and its input columns of o/down (all-reduced in place); embeddings, norms and the LM head stay whole."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .layers import Projections

ROW_ROLES = ("q", "k", "v", "gate", "up")
FUSED_QKV = "qkv"         # a checkpoint's one Q|K|V projection: each rank reads its heads of the three parts
COLUMN_ROLES = ("o", "down")


@dataclass(frozen=True, slots=True)
class TPShard:
    """This process's rank in its instance, and the in-place sum over the ranks (None: no process group)."""
    rank: int
    size: int
    all_reduce: Callable[[torch.Tensor], object] | None = None


def _span(total: int, shard: TPShard) -> tuple[int, int]:
    n = total // shard.size
    return shard.rank * n, (shard.rank + 1) * n


Slice = tuple[int, tuple[tuple[int, int], ...]]      # (dim, the [start, stop) ranges this rank reads, joined)


def _qkv_rows(heads: tuple[int, int, int], shard: TPShard) -> tuple[tuple[int, int], ...]:
    h, hkv, d = heads
    q, k = _span(h * d, shard), _span(hkv * d, shard)
    return q, (h * d + k[0], h * d + k[1]), ((h + hkv) * d + k[0], (h + hkv) * d + k[1])


def shard_model(model: nn.Module, shard: TPShard) -> dict[str, Slice]:
    """Swap in this rank's meta projections (before loading) and return {tensor name: Slice} to read."""
    slices: dict[str, Slice] = {}
    for prefix, m in model.named_modules():
        if not isinstance(m, Projections):
            if getattr(m, "sums_ranks", False):       # a block that all-reduces its parts' sum once
                m.reduce = shard.all_reduce if shard.size > 1 else None
            continue
        heads = m.shape
        if heads is not None:
            h, hkv, d = heads
            m.shape = (h // shard.size, hkv // shard.size, d)
        for role, attr in m.names.items():
            lin: nn.Linear = getattr(m, attr)
            out_f, in_f = lin.out_features, lin.in_features
            name = f"{prefix}.{attr}" if prefix else attr
            split = out_f if role in ROW_ROLES else in_f
            if role in ROW_ROLES + COLUMN_ROLES and split % shard.size:
                raise ValueError(f"tensor parallel: {name} has {split} {'rows' if role in ROW_ROLES else 'columns'}, "
                                 f"not divisible by {shard.size}")
            if role in ROW_ROLES or role == FUSED_QKV:
                rows = (_span(out_f, shard),) if role in ROW_ROLES else _qkv_rows(heads, shard)
                n = sum(b - a for a, b in rows)
                new = nn.Linear(in_f, n, bias=lin.bias is not None, device="meta", dtype=lin.weight.dtype)
                slices[f"{name}.weight"] = (0, rows)
                if lin.bias is not None:
                    slices[f"{name}.bias"] = (0, rows)
            elif role in COLUMN_ROLES:
                new = nn.Linear(in_f // shard.size, out_f, bias=lin.bias is not None, device="meta",
                                dtype=lin.weight.dtype)
                slices[f"{name}.weight"] = (1, (_span(in_f, shard),))   # the bias stays whole: added after the sum
            else:
                continue
            setattr(m, attr, new)
        m.reduce = shard.all_reduce if shard.size > 1 and m.sums_ranks else None
    return slices


def read_slice(handle, name: str, where: Slice) -> torch.Tensor:
    """One rank's part of a checkpoint tensor from an open safetensors file, without reading the rest."""
    dim, ranges = where
    part = handle.get_slice(name)
    pieces = [part[a:b] if dim == 0 else part[:, a:b] for a, b in ranges]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=dim)
