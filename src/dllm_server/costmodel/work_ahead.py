"""The work ahead of a request on its worker, priced (issue 33): how long its remaining forwards
take when every other request there, queued or running, keeps its own forwards and re-prefills.

A worker advances every seated request by one forward per iteration (continuous batching), so a
request that needs F more forwards shares each of its next F iterations with every other request
that still has forwards left then. With other requests i needing f_i forwards and R_i
re-prefills (full-canvas forwards of canvas length L_i), over the next F iterations the worker
runs

    F x c0                                   iteration overhead
  + sum_i row_s(L_i) x min(f_i, F)           cache steps of everyone still decoding (itself too)
  + sum_i recompute_s(L_i) x R_i x min(1, F / f_i)   the share of i's re-prefills that land
                                                      before this request ends (spread evenly)

with c0, row_s and recompute_s from the worker's step-time model (cache steps and recompute steps
priced separately). This is processor sharing with the seat cap ignored (the deficit budget and
max_active_decodes can only delay a request further). Pure numpy: the SLO policy calls it once
per decision round for every request it decides, at every candidate threshold.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class UnitCosts:
    """A worker's iteration cost, split: seconds per iteration, per decode row (its block's tokens
    against keys_per_row keys: row_tokens_s + key_s x canvas), and per re-prefill token (linear and
    quadratic in the canvas)."""
    iteration_s: float
    row_tokens_s: float        # one decode row's fed tokens (a block)
    key_s: float               # per key attended by a decode row
    prefill_token_s: float
    prefill_sq_s: float        # per squared canvas token

    def row_s(self, canvas: np.ndarray) -> np.ndarray:
        return self.row_tokens_s + self.key_s * canvas

    def recompute_s(self, canvas: np.ndarray) -> np.ndarray:
        return self.prefill_token_s * canvas + self.prefill_sq_s * canvas * canvas


@dataclass(frozen=True, slots=True)
class Others:
    """The live requests on one worker: remaining forwards, remaining re-prefills, canvas lengths
    (each at the threshold it was last decided at) and their weight (1, or a share for a request
    the router has not placed yet)."""
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
    """Seconds until a request with `forwards` [C] remaining forwards and `recomputes` [C] remaining
    re-prefills (one value per candidate threshold) finishes, sharing the worker with `others`.
    `own` = (forwards, recomputes, weight) of this request where it is counted among `others` (its
    last decision): that part is taken out first, so it is never counted twice."""
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
