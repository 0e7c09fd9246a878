"""Request behaviour models: per block and forward, how many positions a simulated request commits and where
its EOS lands; the real WorkerCore decides block ends and finishes from that, as with a model.
ParametricBehaviour draws from a ppf table; ReplayBehaviour replays our own traces (docs/simulation.md)."""
from __future__ import annotations

import bisect
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..decoding.canvas import transfer_counts
from ..decoding.params import BlockPolicy

# Simulator ASSUMPTION: positions committed per forward under Fast-dLLM threshold decoding with the KV cache,
# (threshold, ppf, source); linear in between, flat outside.
POSITIONS_PER_FORWARD = {
    "llada-8b": (
        (0.7, 4.85, "assumption from a digest: DiLaServe, 0.9 -> 0.7 cuts denoising steps by 38 % "
                    "(dilaserve_eval_ray.md 1.2): 3.01 / 0.62"),
        (0.9, 3.01, "Fast-dLLM Fig. 1b, LLaDA GSM8K, parallel + cache (dllm_algorithms.md 3.2)"),
        (1.0, 1.0, "assumption: at threshold 1 only the best position commits"),
    ),
    "llada2-mini": (
        (0.5, 5.34, "LLaDA2.1-mini's speed mode (threshold 0.5, no editing): its model card (field_2026-12.md 1)"),
        (0.95, 2.60, "LLaDA2.0-mini at its default threshold 0.95: its model card"),
        (1.0, 1.0, "assumption: at threshold 1 only the best position commits"),
    ),
    "dream-7b": (
        (0.7, 4.85, "assumption: LLaDA-8B's figure"),
        (0.9, 3.01, "assumption: LLaDA-8B's figure (Fast-dLLM reports Dream speed-ups, not tokens per forward)"),
        (1.0, 1.0, "assumption: at threshold 1 only the best position commits"),
    ),
}


# A sensitivity ASSUMPTION (no source): the threshold as a weaker knob than DiLaServe reports, 0.9 -> 0.7 saving
# 15 % of the steps instead of 38 %; results that hold under both curves do not rest on that figure.
WEAK_KNOB = {
    "llada-8b": ((0.7, 3.54, "assumption: 0.9 -> 0.7 saves 15 % of the steps (3.01 / 0.85)"),
                 *POSITIONS_PER_FORWARD["llada-8b"][1:]),
}
CURVES = {"dilaserve": POSITIONS_PER_FORWARD, "weak": WEAK_KNOB}

def positions_per_forward(table, threshold: float) -> float:
    xs = [p[0] for p in table]
    ys = [p[1] for p in table]
    if threshold <= xs[0]:
        return ys[0]
    if threshold >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, threshold)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (threshold - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One simulated request; `eos_at` is the answer position of its first EOS (None: none before max_tokens)."""
    arrival_s: float
    prompt_len: int
    max_tokens: int
    eos_at: int | None = None
    ignore_eos: bool = True
    threshold: float | None = None
    slo_ms: float | None = None
    steps: int | None = None             # a fixed-steps rule instead of the threshold


class Behaviour:
    """Per block, each forward's commits (from `block_counts`), cached. Spare positions (past the EOS or
    max_tokens) commit first, so a block ends exactly at its last planned forward, as when recorded."""

    def __init__(self) -> None:
        self.requests: dict[str, tuple[int, int | None]] = {}   # request id -> (arrival seq, eos_at)
        self._plans: dict[tuple[str, int], tuple] = {}

    def register(self, request_id: str, seq: int, req: SimRequest) -> None:
        self.requests[request_id] = (seq, None if req.ignore_eos else req.eos_at)

    def forget(self, request_id: str, num_blocks: int) -> None:
        self.requests.pop(request_id, None)
        for b in range(num_blocks):
            self._plans.pop((request_id, b), None)

    def block_counts(self, seq: int, block: int, needed: int, width: int, policy: BlockPolicy) -> list[int]:
        """Positions committed by each forward: each >= 1, needed <= sum <= width."""
        raise NotImplementedError

    def commit_range(self, t) -> tuple[tuple[tuple[int, int], ...], int | None]:
        """The block-relative column ranges a BlockTask's current forward commits, and the EOS column or None."""
        key = (t.request_id, t.block_index)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(t)
        steps, shape = plan
        return steps[t.step] if t.step < len(steps) else _step(shape, t.step)

    def _plan(self, t) -> tuple[list, tuple]:
        # a block-causal model's first block begins with the prompt's tail, which never commits
        seq, eos_at = self.requests[t.request_id]
        p = t.params
        first = max(0, t.prompt_len - t.start)
        width = t.end - t.start - first
        offset = t.start + first - t.prompt_len
        limit = min(p.max_tokens, eos_at + 1) if eos_at is not None else p.max_tokens
        needed = max(1, min(width, limit - offset))
        counts = self.block_counts(seq, t.block_index, needed, width, t.policy)
        cum = list(itertools.accumulate(counts, initial=0))
        eos_col = eos_at - offset if eos_at is not None and 0 <= eos_at - offset < width else None
        shape = (cum, cum[-1] - needed, needed, eos_col, first)
        return [_step(shape, s) for s in range(len(counts))], shape


def _step(shape: tuple, s: int) -> tuple[tuple[tuple[int, int], ...], int | None]:
    cum, spare, needed, eos_col, first = shape
    a = cum[s] if s < len(cum) else cum[-1]
    b = cum[s + 1] if s + 1 < len(cum) else cum[-1]
    if b <= a:                                       # past the plan (never expected): finish the block
        a, b = min(a, cum[-1] - 1), cum[-1]
    ranges = []
    if a < spare:
        ranges.append((needed + a, needed + min(b, spare)))
    if b > spare:
        ranges.append((max(a, spare) - spare, b - spare))
    eos = None
    if eos_col is not None:
        eos = eos_col if any(lo <= eos_col < hi for lo, hi in ranges) else None
    if first:
        ranges = [(lo + first, hi + first) for lo, hi in ranges]
        eos = None if eos is None else eos + first
    return tuple(ranges), eos


def _fixed(policy: BlockPolicy, width: int) -> list[int] | None:
    """A fixed-steps policy's own counts (LLaDA's linear schedule)."""
    if policy.steps is None:
        return None
    return transfer_counts(width, max(1, min(policy.steps, width)))


class ParametricBehaviour(Behaviour):
    """Draws are per request in block order, so a request denoises alike in every configuration compared."""

    def __init__(self, model: str = "llada-8b", seed: int = 0, table=None):
        super().__init__()
        self.table = table or POSITIONS_PER_FORWARD[model]
        self.seed = seed
        self._rng: dict[int, np.random.Generator] = {}
        self._extra: dict[float, float] = {}

    def forget(self, request_id: str, num_blocks: int) -> None:
        seq = self.requests.get(request_id, (None,))[0]
        super().forget(request_id, num_blocks)
        self._rng.pop(seq, None)

    def block_counts(self, seq: int, block: int, needed: int, width: int, policy: BlockPolicy) -> list[int]:
        fixed = _fixed(policy, width)
        if fixed is not None:
            return fixed
        extra = self._extra.get(policy.threshold)
        if extra is None:
            extra = self._extra[policy.threshold] = positions_per_forward(self.table, policy.threshold) - 1.0
        rng = self._rng.get(seq)
        if rng is None:
            rng = self._rng[seq] = np.random.default_rng((self.seed, seq))
        extras = rng.poisson(extra, size=needed).tolist() if extra > 0 else [0] * needed
        counts, left = [], needed
        for d in extras:
            c = min(d + 1, left)
            counts.append(c)
            left -= c
            if not left:
                break
        return counts


def load_trace_rows(path: str | Path) -> list[dict]:
    """The "end" rows of one trace file or of every *.jsonl in a folder."""
    p = Path(path)
    files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    rows = []
    for f in files:
        for line in f.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row.get("kind", "end") == "end" and "steps_per_block" in row:
                    rows.append(row)
    return rows


def rows_from_outputs(outputs, params) -> list[dict]:
    """Replay rows (policy/tracing.py's end-row fields) from a run's GenerationOutputs and their SamplingParams."""
    rows = []
    for seq, (o, p) in enumerate(zip(outputs, params)):
        eos_at = len(o.token_ids) - 1 if o.finish_reason == "stop" and not p.ignore_eos else None
        rows.append({"kind": "end", "arrival_seq": seq, "finish": o.finish_reason, "forwards": o.stats.num_forwards,
                     "steps_per_block": list(o.stats.steps_per_block),
                     "thresholds": [b.threshold for b in o.stats.block_policies], "tokens": len(o.token_ids),
                     "prompt_len": len(o.prompt_token_ids), "max_tokens": p.max_tokens,
                     "block_length": p.block_length, "ignore_eos": p.ignore_eos, "eos_at": eos_at})
    return rows


def requests_from_rows(rows: list[dict], arrivals_s=None, block_length: int | None = None) -> list[SimRequest]:
    """The recorded requests as a simulated workload (all arriving at 0 unless offsets are given)."""
    rows = sorted(rows, key=lambda r: r["arrival_seq"])
    at = list(arrivals_s) if arrivals_s is not None else [0.0] * len(rows)
    return [SimRequest(float(t), int(r["prompt_len"]), int(r["max_tokens"]), r.get("eos_at"),
                       bool(r.get("ignore_eos", False)), (r.get("thresholds") or [None])[0])
            for t, r in zip(at, rows)]


class ReplayBehaviour(Behaviour):
    """Exact for recorded requests (by `arrival_seq`); others draw a recorded full block's forwards at the
    nearest threshold, scaled to the positions needed."""

    def __init__(self, rows: list[dict], seed: int = 0):
        super().__init__()
        self.by_seq = {int(r["arrival_seq"]): r for r in rows if r.get("arrival_seq") is not None}
        self.full: dict[float, list[int]] = {}
        for r in rows:
            bl = r.get("block_length")
            for k, (f, tau) in enumerate(zip(r["steps_per_block"], r.get("thresholds") or [])):
                if bl is None or (k + 1) * bl <= r.get("tokens", 0):
                    self.full.setdefault(round(float(tau), 4), []).append(int(f))
        self.seed = seed

    def recorded(self, seq: int) -> dict | None:
        return self.by_seq.get(seq)

    def block_counts(self, seq: int, block: int, needed: int, width: int, policy: BlockPolicy) -> list[int]:
        row = self.by_seq.get(seq)
        if row is not None and block < len(row["steps_per_block"]):
            forwards = int(row["steps_per_block"][block])
        else:
            fixed = _fixed(policy, width)
            if fixed is not None:
                return fixed
            forwards = self._sample(seq, block, needed, width, policy.threshold)
        forwards = max(1, min(forwards, width))
        return transfer_counts(max(needed, forwards), forwards)

    def _sample(self, seq: int, block: int, needed: int, width: int, threshold: float) -> int:
        if not self.full:
            return needed
        tau = min(self.full, key=lambda x: (abs(x - threshold), x))
        pool = self.full[tau]
        f = pool[int(np.random.default_rng((self.seed, seq, block)).integers(len(pool)))]
        return max(1, math.ceil(f * needed / width))
