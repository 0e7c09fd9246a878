"""The cluster planner's input C[d, tau]: req/s ONE instance of TP degree d sustains at threshold tau within the
SLO, for running and unstarted degrees. Formula and bounds: docs/reconfiguration.md "The capacity table"."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ..costmodel.step_time import StepTimeModel, features

IterationTime = Callable[[int, int, float, float, float], float]   # (d, rows, keys, prefill_tokens, prefill_sq) -> s


def iteration_at(iteration_s: IterationTime, degree: int, batch: int, recompute_steps: float,
                 canvas_tokens: int) -> float:
    """t_d(n) in seconds; a fractional `recompute_steps` is priced as the mix of its floor and ceil."""
    low = math.floor(recompute_steps)
    frac = recompute_steps - low
    keys = batch * canvas_tokens

    def at(k: int) -> float:
        return iteration_s(degree, batch, keys, k * canvas_tokens, k * canvas_tokens ** 2)
    t = at(low)
    return t if frac <= 1e-12 else (1 - frac) * t + frac * at(low + 1)


def recompute_allowance(batch: int, token_budget: int | None, credit_share: float, row_tokens: int) -> float:
    """Recompute tokens per iteration the deficit budget (worker/admission.py) admits on average."""
    if token_budget is None:
        return float("inf")
    return float(max(token_budget - batch * row_tokens, max(1, int(token_budget * credit_share))))


def instance_capacity(iteration_s: IterationTime, degree: int, forwards_per_request: float,
                      recomputes_per_request: float, canvas_tokens: int, slo_s: float,
                      seats: int, *, token_budget: int | None = None, credit_share: float = 0.125,
                      row_tokens: int = 0) -> tuple[float, int]:
    """(C[d, j] in req/s, its batch); every batch is tried: with recomputes the best need not be the largest."""
    if forwards_per_request < max(1.0, recomputes_per_request):
        raise ValueError(f"forwards_per_request {forwards_per_request} < recomputes_per_request "
                         f"{recomputes_per_request} (or < 1)")
    best, best_batch = 0.0, 0
    for n in range(1, max(1, seats) + 1):
        share = n * recomputes_per_request / forwards_per_request
        if n > 1 and share * canvas_tokens > recompute_allowance(n, token_budget, credit_share, row_tokens):
            break                         # the allowance only shrinks and the need only grows with n
        t = iteration_at(iteration_s, degree, n, share, canvas_tokens)
        if t <= 0:
            continue
        latency_s = forwards_per_request * t
        if latency_s > slo_s:
            continue                      # t need not grow with n (a roofline's floors): try the rest
        if n / latency_s > best:
            best, best_batch = n / latency_s, n
    return best, best_batch


def capacity_table(degrees: Sequence[int], thresholds: Sequence[float], iteration_s: IterationTime,
                   forwards_per_request: Sequence[float], recomputes_per_request: float | Sequence[float],
                   canvas_tokens: int, slo_s: float, seats: int | Mapping[int, int], *,
                   token_budget: int | None = None, credit_share: float = 0.125,
                   row_tokens: int = 0) -> dict[tuple[int, float], float]:
    """{(degree, threshold): req/s one instance sustains within `slo_s`}."""
    if len(forwards_per_request) != len(thresholds):
        raise ValueError(f"{len(forwards_per_request)} forwards_per_request for {len(thresholds)} thresholds")
    recomputes = np.broadcast_to(np.asarray(recomputes_per_request, dtype=float), (len(thresholds),))
    table = {}
    for d in degrees:
        seats_d = seats[d] if isinstance(seats, Mapping) else seats
        for tau, forwards, r in zip(thresholds, forwards_per_request, recomputes):
            table[(d, tau)] = instance_capacity(iteration_s, d, float(forwards), float(r), canvas_tokens, slo_s,
                                                seats_d, token_budget=token_budget, credit_share=credit_share,
                                                row_tokens=row_tokens)[0]
    return table


def from_step_time_model(models: StepTimeModel | Mapping[int, StepTimeModel], block_length: int) -> IterationTime:
    """iteration_s from fitted step-time models (one for all degrees, or {degree: model}); unfitted predicts 0."""
    def iteration_s(degree: int, decode_rows: int, decode_keys: float, prefill_tokens: float,
                    prefill_sq: float) -> float:
        model = models if isinstance(models, StepTimeModel) else models[degree]
        return model.predict(features(decode_rows * block_length, decode_keys, prefill_tokens, prefill_sq))
    return iteration_s


@dataclass(frozen=True, slots=True)
class _Fed:
    prefill_tokens: int
    decode_tokens: int
    decode_keys: int
    prefill_sq: int
    num_prefills: int
    num_decodes: int


def from_roofline(cost_by_degree: Mapping[int, object]) -> IterationTime:
    """iteration_s from roofline cost models per degree (costmodel/gpu.py), duck-typed: the whole turn."""
    def iteration_s(degree: int, decode_rows: int, decode_keys: float, prefill_tokens: float,
                    prefill_sq: float) -> float:
        cost = cost_by_degree[degree]
        # equal canvases: k of them give tokens k c and squares k c^2, so k = tokens^2 / squares
        canvases = round(prefill_tokens ** 2 / prefill_sq) if prefill_sq > 0 else int(prefill_tokens > 0)
        it = _Fed(int(prefill_tokens), decode_rows * cost.block_length, int(decode_keys), int(prefill_sq),
                  canvases, decode_rows)
        return cost.turn_s(it)
    return iteration_s


def roofline_seats(cost_by_degree: Mapping[int, object], canvas_tokens: int,
                   max_active_decodes: int = 64) -> dict[int, int]:
    """seats_d = min(max_active_decodes, the instance's KV pool over one canvas)."""
    return {d: max(1, min(max_active_decodes, c.kv_pool_tokens() // max(1, canvas_tokens)))
            for d, c in cost_by_degree.items()}
