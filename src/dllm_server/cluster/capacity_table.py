"""The cluster planner's input (DiLaServe, shared/reference/cluster_level.md 4.2): C[d, tau], the
request rate ONE instance of tensor-parallel degree d sustains at threshold tau with every request
within the SLO, for instances that run now and for degrees that do not exist yet.

A request at tau_j runs F_j = K_j + R forwards: R recompute steps (a full-canvas forward, one per
block: the prefill and each re-prefill) and K_j cache steps (its block against cached K/V). With
n requests seated, an iteration feeds n decode rows (their blocks against n x canvas keys) plus,
on average, s = n R / F_j recompute steps (the share of the seated requests' forwards that are
full-canvas ones), each a canvas of c tokens (c and c^2 for attention). Every iteration advances
each seated request by one forward, so a request is done in F_j iterations:

    t_d(n)  = iteration time at degree d with n decode rows, n c keys and s canvases of c tokens
    C[d,j]  = max over 1 <= n <= seats_d with F_j t_d(n) <= slo_s of n / (F_j t_d(n))
              (0 when even n = 1 misses the SLO)

The worker's deficit token budget (worker/admission.py) bounds the recompute tokens an iteration
can take: on average at most max(tau_budget - n x row_tokens, credit_share x tau_budget), the
credit the decodes leave (unused credit carries over, so this holds on average, not per
iteration). A batch whose re-prefills need more, n R c / F_j > that, is not sustainable: its
requests would wait for their re-prefills rather than step every iteration, so it is left out
(`token_budget`; None: unlimited, as the admission). Without this bound the table priced batches
of 48-64 requests at TP1 where the budget (1024 tokens, ~1800-token canvases) sustains 5, and
came out 1.3-1.5x what the simulator completes (docs/simulation.md; measured before the bound).

`canvas_tokens` is the canvas of a seated request, i.e. the mean canvas weighted by forwards
(long requests are seated longer): E[F c] / E[F], which is what the mean over the requests live
at any instant estimates. The plain mean per request underprices a heavy-tailed mix (ShareGPT-
like lengths: 1453 tokens per request, 1779 per seated request).

A fractional s is priced as the mix of iterations with floor(s) and ceil(s) canvases (for a linear
step-time model that is exactly the model at s; for the roofline it keeps launch floors honest).
Counting every seated request as a decode row, even on its recompute step, overstates an
iteration by at most s rows: conservative. `iteration_s(degree, decode_rows, decode_keys,
prefill_tokens, prefill_sq) -> seconds` is a callable, backed by a live instance's fitted
StepTimeModel (`from_step_time_model`) or by the simulator's roofline at degree d
(`from_roofline`, duck-typed: policy/ never imports sim/). Pure functions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from ..costmodel.step_time import StepTimeModel, features

IterationTime = Callable[[int, int, float, float, float], float]   # (d, rows, keys, prefill_tokens, prefill_sq) -> s


def iteration_at(iteration_s: IterationTime, degree: int, batch: int, recompute_steps: float,
                 canvas_tokens: int) -> float:
    """t_d(n): `batch` decode rows over their canvases plus `recompute_steps` (on average, maybe
    fractional) full-canvas forwards in one iteration."""
    low = math.floor(recompute_steps)
    frac = recompute_steps - low
    keys = batch * canvas_tokens

    def at(k: int) -> float:
        return iteration_s(degree, batch, keys, k * canvas_tokens, k * canvas_tokens ** 2)
    t = at(low)
    return t if frac <= 1e-12 else (1 - frac) * t + frac * at(low + 1)


def recompute_allowance(batch: int, token_budget: int | None, credit_share: float, row_tokens: int) -> float:
    """The recompute tokens per iteration the deficit budget admits on average beside `batch`
    decode rows of `row_tokens` each (worker/admission.py: the credit earned per iteration)."""
    if token_budget is None:
        return float("inf")
    return float(max(token_budget - batch * row_tokens, max(1, int(token_budget * credit_share))))


def instance_capacity(iteration_s: IterationTime, degree: int, forwards_per_request: float,
                      recomputes_per_request: float, canvas_tokens: int, slo_s: float,
                      seats: int, *, token_budget: int | None = None, credit_share: float = 0.125,
                      row_tokens: int = 0) -> tuple[float, int]:
    """(C[d, j] in req/s, the batch that reaches it; 0 when none fits the SLO). Every batch size is
    tried: with recompute steps the best need not be the largest batch that fits; batches whose
    re-prefills the token budget cannot feed are not sustainable and are skipped."""
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
            continue                      # no model there yet: nothing is known about this batch
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
    """{(degree, threshold): req/s one instance sustains within `slo_s`} (formula in the module
    docstring). forwards_per_request[j] = F_j at thresholds[j]; recomputes_per_request = R (one
    for all thresholds, or one per threshold); seats: one for all degrees or {degree: seats_d}
    (min(max_active_decodes, pool tokens / canvas), `roofline_seats`); token_budget, credit_share:
    the workers' admission policy, row_tokens: the tokens a decode row feeds (its block)."""
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
    """iteration_s from fitted step-time models: one for every degree asked, or {degree: model}
    (a live instance's model per degree). An unfitted model predicts 0: that batch is skipped."""
    def iteration_s(degree: int, decode_rows: int, decode_keys: float, prefill_tokens: float,
                    prefill_sq: float) -> float:
        model = models if isinstance(models, StepTimeModel) else models[degree]
        return model.predict(features(decode_rows * block_length, decode_keys, prefill_tokens, prefill_sq))
    return iteration_s


@dataclass(frozen=True, slots=True)
class _Fed:
    """What a cost model's `turn_s` reads of an iteration (worker/core.py: IterationStats's fields,
    without importing the worker)."""
    prefill_tokens: int
    decode_tokens: int
    decode_keys: int
    prefill_sq: int
    num_prefills: int
    num_decodes: int


def from_roofline(cost_by_degree: Mapping[int, object]) -> IterationTime:
    """iteration_s from cost models per degree (costmodel/gpu.py: gpu_cost(model, device, tp=d)):
    the whole turn (forward plus host work), each decode row feeding the cost's block."""
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
