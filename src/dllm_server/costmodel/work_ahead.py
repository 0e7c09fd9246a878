"""Prices the work ahead of a request on its worker as processor sharing, seat cap ignored (docs/slo.md): over its
next F forwards the worker runs F c0 + sum_i row_s(L_i) min(f_i, F) + sum_i recompute_s(L_i) R_i min(1, F / f_i),
for every request i there with f_i forwards and R_i re-prefills left at canvas length L_i."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class UnitCosts:
    """A worker's iteration cost in seconds: per iteration, per decode row (row_tokens_s + key_s x canvas) and per
    re-prefill (prefill_token_s x canvas + prefill_sq_s x canvas^2)."""
    iteration_s: float
    row_tokens_s: float
    key_s: float
    prefill_token_s: float
    prefill_sq_s: float

    def row_s(self, canvas: np.ndarray) -> np.ndarray:
        return self.row_tokens_s + self.key_s * canvas

    def recompute_s(self, canvas: np.ndarray) -> np.ndarray:
        return self.prefill_token_s * canvas + self.prefill_sq_s * canvas * canvas


@dataclass(frozen=True, slots=True)
class Others:
    """Live requests on one worker at their last decided threshold; weight 1, or a share for one not yet routed."""
    forwards: np.ndarray
    recomputes: np.ndarray
    canvas: np.ndarray
    weight: np.ndarray

    @classmethod
    def empty(cls) -> "Others":
        z = np.zeros(0)
        return cls(z, z, z, z)

    def plus(self, extra: list[tuple[float, float, float]], weight: float) -> "Others":
        """These and `extra` (forwards, recomputes, canvas) requests, each of the latter at `weight`."""
        f, r, c = (np.asarray(v, dtype=float) for v in zip(*extra))
        return Others(np.concatenate([self.forwards, f]), np.concatenate([self.recomputes, r]),
                      np.concatenate([self.canvas, c]), np.concatenate([self.weight, np.full(len(f), weight)]))


def queued_seconds(forwards: np.ndarray, recomputes: np.ndarray, canvas: float, others: Others,
                   unit: UnitCosts, own: tuple[float, float, float] | None = None) -> np.ndarray:
    """Seconds until a request with `forwards` / `recomputes` [C] left (one per candidate threshold) finishes
    beside `others`. `own`: its (forwards, recomputes, weight) entry in `others`, taken out so it counts once."""
    F = np.maximum(np.asarray(forwards, dtype=float), 0.0)
    R = np.asarray(recomputes, dtype=float)
    f, r, w = others.forwards, others.recomputes, others.weight
    row, rec = unit.row_s(others.canvas), unit.recompute_s(others.canvas)
    safe_f = np.maximum(f, 1.0)
    decodes = (w * row * np.minimum(f[None, :], F[:, None])).sum(axis=1)
    reprefills = (w * rec * r * np.minimum(1.0, F[:, None] / safe_f[None, :])).sum(axis=1)
    row_own, rec_own = unit.row_s(np.asarray(canvas)), unit.recompute_s(np.asarray(canvas))
    if own is not None:
        f_own, r_own, w_own = own
        decodes = decodes - w_own * row_own * np.minimum(f_own, F)
        reprefills = reprefills - w_own * rec_own * r_own * np.minimum(1.0, F / max(f_own, 1.0))
    return F * unit.iteration_s + row_own * F + rec_own * R + np.maximum(decodes, 0.0) + np.maximum(reprefills, 0.0)
