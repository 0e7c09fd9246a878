"""Model instances of a simulated cluster: a layout of TP degrees turned into one simulated worker per instance
(costed by `gpu_cost(..., tp=d)`, its pool that cost's), the start-up profile such a worker reports, and
per-request SLOs from an instance's unloaded latency."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..cluster.layout_ilp import describe_counts
from ..costmodel.iteration import IterationStats
from ..worker.runner import fed_range


@dataclass(frozen=True)
class Instance:
    degree: int
    cost: object         # costmodel/fitted.py protocol
    num_pages: int


def layout_degrees(counts: Mapping[int, int]) -> tuple[int, ...]:
    """{degree: instances} -> one degree per instance, largest first: {2: 8} -> (2,) * 8."""
    return tuple(d for d in sorted(counts, reverse=True) for _ in range(int(counts[d])))


def layout_name(degrees: Sequence[int]) -> str:
    counts: dict[int, int] = {}
    for d in degrees:
        counts[d] = counts.get(d, 0) + 1
    return describe_counts(counts)


def layout_instances(degrees: Sequence[int], cost_for, page_size: int) -> list[Instance]:
    """One Instance per entry of `degrees`; a cost model holds no per-worker state, so one per degree is shared."""
    cache: dict[int, object] = {}
    out = []
    for d in degrees:
        if d not in cache:
            cache[d] = cost_for(d)
        c = cache[d]
        out.append(Instance(d, c, c.kv_pool_tokens() // page_size))
    return out


def startup_profile(cost, block_length: int, cache: str, lead: int, max_len: int, num_pages: int,
                    page_size: int) -> tuple[tuple[float, ...], ...]:
    """worker/profile.py's iterations as WorkerReady.profile rows, each timed by the cost model's whole turn
    (not the forward): later LoadReports carry the whole turn too."""
    lengths = [n for n in (192, 448) if n + block_length <= max_len
               and -(-(n + block_length) // page_size) * 5 <= num_pages] or [min(max_len, 2 * block_length)]
    short, long_ = (max(1, n - block_length) + block_length for n in (lengths[0], lengths[-1]))

    def fed(canvas: int) -> int:
        a, b = fed_range(cache, False, canvas - block_length, canvas, canvas, lead)
        return b - a

    def it(prefills: Sequence[int], decodes: Sequence[int]) -> IterationStats:
        return IterationStats(sum(prefills), sum(fed(c) for c in decodes), sum(decodes),
                              sum(c * c for c in prefills), len(prefills), len(decodes))
    plan = ([it([short] * 4, [])] + [it([], [short] * 4)] * 3 + [it([], [short] * 2)] * 2
            + [it([long_], [short] * 2), it([short], [short, short, long_])] + [it([], [short, long_, short])] * 2)
    return tuple((float(s.decode_tokens), float(s.decode_keys), float(s.prefill_tokens), float(s.prefill_sq),
                  cost.turn_s(s)) for s in plan)


def unloaded_latency_s(cost, prompt_len: int, max_tokens: int, block_length: int, positions_per_forward: float,
                       cache: str = "dual", lead: int = 0) -> float:
    """Seconds for a request alone on an instance: per block a full-canvas forward, cache steps at batch 1
    and two front <-> worker messages; the canvas holds the prompt and the whole answer buffer."""
    canvas = prompt_len + max_tokens
    a, b = fed_range(cache, False, canvas - block_length, canvas, canvas, lead)
    pre = cost.turn_s(IterationStats(canvas, 0, 0, canvas * canvas, 1, 0))
    step = cost.turn_s(IterationStats(0, b - a, canvas, 0, 0, 1))
    total, left = 0.0, max_tokens
    while left > 0:
        n = min(block_length, left)
        forwards = max(1, math.ceil(n / positions_per_forward))
        total += pre + (forwards - 1) * step + 2 * cost.message_latency_s
        left -= n
    return total


def with_slos(requests: list, slo_s: Sequence[float]) -> list:
    return [dataclasses.replace(r, slo_ms=1e3 * s) for r, s in zip(requests, slo_s)]
