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


def shard_model(model: nn.Module, shard: TPShard) -> dict[str, tuple[int, int, int]]:
    """Swap in this rank's meta projections (before loading) and return {tensor name: (dim, start, stop)} to read."""
    slices: dict[str, tuple[int, int, int]] = {}
    for prefix, m in model.named_modules():
        if not isinstance(m, Projections):
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
            if role in ROW_ROLES:
                a, b = _span(out_f, shard)
                new = nn.Linear(in_f, b - a, bias=lin.bias is not None, device="meta", dtype=lin.weight.dtype)
                slices[f"{name}.weight"] = (0, a, b)
                if lin.bias is not None:
                    slices[f"{name}.bias"] = (0, a, b)
            elif role in COLUMN_ROLES:
                a, b = _span(in_f, shard)
                new = nn.Linear(b - a, out_f, bias=lin.bias is not None, device="meta", dtype=lin.weight.dtype)
                slices[f"{name}.weight"] = (1, a, b)      # the bias stays whole: added once, after the sum
            else:
                continue
            setattr(m, attr, new)
        m.reduce = shard.all_reduce if shard.size > 1 else None
    return slices


def read_slice(handle, name: str, where: tuple[int, int, int]) -> torch.Tensor:
    """One rank's part of a checkpoint tensor from an open safetensors file, without reading the rest."""
    dim, a, b = where
    part = handle.get_slice(name)
    return part[a:b] if dim == 0 else part[:, a:b]
