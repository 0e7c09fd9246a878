"""Model instances of a simulated cluster: a layout (the tensor-parallel degree of each instance,
e.g. 8 x TP2) turned into what the Simulator takes per worker (one cost model and one KV page count
per instance: an instance of degree d is ONE simulated worker costed by `gpu_cost(..., tp=d)`, its
pool that cost's `kv_pool_tokens()`), the start-up profile a worker of that cost would report
(worker/profile.py's shapes, timed by the cost model instead of the clock), and per-request SLOs
sized from an instance's unloaded latency. Pure functions over plain data.

A run with a layout *schedule* (a reconfiguring cluster) builds each layout of it with
`layout_instances`; a static run is a schedule of one layout.
"""
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
    degree: int          # GPUs it spans (tensor-parallel degree)
    cost: object         # its cost model (costmodel/fitted.py protocol)
    num_pages: int       # its KV pool, in pages


def layout_degrees(counts: Mapping[int, int]) -> tuple[int, ...]:
    """{degree: instances} -> one degree per instance, largest first: {2: 8} -> (2,) * 8."""
    return tuple(d for d in sorted(counts, reverse=True) for _ in range(int(counts[d])))


def layout_name(degrees: Sequence[int]) -> str:
    counts: dict[int, int] = {}
    for d in degrees:
        counts[d] = counts.get(d, 0) + 1
    return describe_counts(counts)


def layout_instances(degrees: Sequence[int], cost_for, page_size: int) -> list[Instance]:
    """One Instance per entry of `degrees`; `cost_for(d)` gives degree d's cost model (built once
    per degree and shared: a cost model holds no per-worker state)."""
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
    """What worker/profile.py reports for a worker of this cost, as WorkerReady.profile rows
    (decode_tokens, decode_keys, prefill_tokens, prefill_sq, seconds): the same iterations (4
    prefills; 4, then 2 decodes; a long prefill beside 2 decodes, a short one beside 3; 3 decodes),
    each timed by the cost model's turn. The turn, not the forward: the reports that refine the
    front's step-time model afterwards carry the whole turn (LoadReport.iteration_s), and the real
    profile's clock also runs over the core's host bookkeeping."""
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
    """An estimate of a request's latency alone on an instance of this cost: per block, a
    full-canvas forward (prefill or re-prefill) and then cache steps at batch 1, block / ppf
    forwards in all (the last block only its share), two front <-> worker messages between blocks.
    The canvas holds the prompt and the whole answer buffer (request_state.submit_msg)."""
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
    """The same requests, each with its own SLO (seconds) as slo_ms."""
    return [dataclasses.replace(r, slo_ms=1e3 * s) for r, s in zip(requests, slo_s)]
