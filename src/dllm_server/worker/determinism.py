"""Batch invariance, checked on this device at worker start (docs/decoding.md): does a row's result of the
model's projections depend on how many rows share the matmul? Kernels pick their blocking by the row count,
differently per CPU, so it is measured rather than assumed; `fixed_matmul_rows` forces it."""
from __future__ import annotations

import time
from typing import Callable, Iterable

import torch
from torch import nn

from ..messages import RowInvariance
from ..model.layers import ServingLinear

SMALL_ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 100, 127, 129, 255)
DECODES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# FLOPs per projection shape: bounds the check's start-up cost
FLOP_BUDGET = {"cpu": 1.5e9, "cuda": 2e12}
MAX_FAILURES = 8


def row_counts(block_len: int, max_active_decodes: int, max_rows: int) -> list[int]:
    """Row counts below `max_rows` that block steps and prefills (the small and odd counts) give a worker."""
    counts = set(SMALL_ROWS) | {k * block_len for k in DECODES if k <= max_active_decodes}
    return sorted(c for c in counts if 1 <= c < max_rows)


def within_budget(counts: list[int], flops_per_row: float, budget: float) -> tuple[list[int], int]:
    """The longest prefix of ascending `counts`, and its reference row count, whose check fits `budget` FLOPs."""
    kept = list(counts)
    while kept:
        ref = kept[-1] + 1
        if flops_per_row * (ref + 2 * sum(kept)) <= budget:
            return kept, ref
        kept.pop()
    return [], 2


def check_rows(matmul: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, counts: Iterable[int]) -> list[int]:
    """Row counts r whose first or last r rows of `x`, alone in a call, differ bitwise from the call over all."""
    with torch.inference_mode():
        full = matmul(x)
        n = x.shape[0]
        return [r for r in counts
                if not torch.equal(matmul(x[:r]), full[:r]) or not torch.equal(matmul(x[n - r:]), full[n - r:])]


def projections(model: nn.Module) -> dict[tuple[int, int], ServingLinear]:
    out: dict[tuple[int, int], ServingLinear] = {}
    for m in model.modules():
        if isinstance(m, ServingLinear):
            out.setdefault(tuple(m.weight_t.shape), m)
    return out


def check_model(model: nn.Module, block_len: int, max_active_decodes: int, seed: int = 0) -> RowInvariance:
    t0 = time.perf_counter()
    failures, checked, shapes = [], set(), []
    g = torch.Generator().manual_seed(seed)
    for (k, n), lin in sorted(projections(model).items()):
        w = lin.weight_t
        wanted = row_counts(block_len, max_active_decodes, block_len * max_active_decodes + 1)
        counts, max_rows = within_budget(wanted, 2.0 * k * n, FLOP_BUDGET.get(w.device.type, FLOP_BUDGET["cpu"]))
        x = torch.randn(max_rows, k, generator=g).to(device=w.device, dtype=w.dtype)
        checked.update(counts)
        shapes.append((k, n))
        failures += [f"{k}->{n}: {r} of {max_rows} rows" for r in check_rows(lin.matmul, x, counts)]
    return RowInvariance(not failures, tuple(sorted(checked)), tuple(shapes), tuple(failures[:MAX_FAILURES]),
                         len(failures), round(time.perf_counter() - t0, 3), fixed_rows=fixed_rows_of(model))


def fixed_rows_of(model: nn.Module) -> int:
    return next((m.fixed_rows for m in model.modules() if isinstance(m, ServingLinear)), 0)


def set_fixed_rows(model: nn.Module, rows: int) -> None:
    """Every projection runs as matmuls of exactly `rows` rows (0: one call of any size)."""
    for m in model.modules():
        if isinstance(m, ServingLinear):
            m.fixed_rows = rows


def summary(r: RowInvariance) -> str:
    mode = f"fixed {r.fixed_rows}-row matmuls" if r.fixed_rows else "one matmul per projection"
    if r.holds:
        return (f"batch invariance holds ({mode}; {len(r.shapes)} projection shapes, {len(r.row_counts)} row counts "
                f"up to {max(r.row_counts, default=0)}, {r.seconds:.2f} s): results are bitwise independent of "
                "batching and placement")
    return (f"batch invariance does NOT hold on this device ({mode}; {r.num_failures} failures, e.g. "
            f"{'; '.join(r.failures[:3])}): results may differ with batching and placement in rounding, so tokens "
            "can differ where two candidates nearly tie; --fixed-matmul-rows forces it (docs/decoding.md)")
