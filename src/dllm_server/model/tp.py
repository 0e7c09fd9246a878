"""Tensor parallelism (Megatron-style) as a transform of a built model, so the model files read
the same at TP=1 (the shape of gpt-fast's tp.py).

Rank r of d keeps, in every layer:
- Q, K and V split by head ranges (H/d query heads, Hkv/d KV heads), later fused per rank into one
  matmul (a contiguous cut of the fused Q|K|V would mix Q rows into K);
- gate and up split by output rows, fused per rank;
- the attention output and MLP down projections split by input columns: each rank's product is a
  partial sum, all-reduced in place before the residual (an output bias is added once, after);
- embeddings, norms, rotary and the LM head whole (only the leader asks for logits).

`shard_model` swaps in the rank's (meta) projections and returns the slice of every sharded
checkpoint tensor it needs, so the loader reads only those slices (safetensors' lazy slicing)
and a rank holds about 1/d of the sharded layers' weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .layers import Projections

ROW_ROLES = ("q", "k", "v", "gate", "up")    # split by output rows
COLUMN_ROLES = ("o", "down")                 # split by input columns, all-reduced after


@dataclass(frozen=True, slots=True)
class TPShard:
    """This process's place in its instance: rank of size, and the in-place sum over the
    instance's ranks (None when loading without a process group, e.g. in tests)."""
    rank: int
    size: int
    all_reduce: Callable[[torch.Tensor], object] | None = None


def _span(total: int, shard: TPShard) -> tuple[int, int]:
    n = total // shard.size
    return shard.rank * n, (shard.rank + 1) * n


def shard_model(model: nn.Module, shard: TPShard) -> dict[str, tuple[int, int, int]]:
    """Give every layer this rank's projections (fresh, on the meta device: the model must not be
    loaded yet) and return {checkpoint tensor name: (dim, start, stop)} for each sharded tensor."""
    slices: dict[str, tuple[int, int, int]] = {}
    for prefix, m in model.named_modules():
        if not isinstance(m, Projections):
            continue
        heads = m.shape                        # (H, Hkv, D) on attention layers
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
