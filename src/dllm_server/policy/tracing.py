"""Trace mode: wraps the decode policy (decisions unchanged) and writes JSONL for scripts/train_step_predictor.py
and sim/behaviour.py's replay: "admit" and "step" rows with `x` = progress.feature_row at the block's threshold,
then one "end" row per request. Writes are buffered; one file per server start."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..decoding.params import BlockPolicy
from ..request.state import GenerationOutput, RequestState
from ..messages import BlockDone, LoadReport, StepDelta
from .progress import Progress, feature_row


def replay_fields(state: RequestState) -> dict:
    """What a replay needs besides the forwards; `eos_at`: the first stop token's answer position, else None."""
    p = state.params
    n = state.visible_len()
    eos_at = n if not p.ignore_eos and n < min(p.max_tokens, state.answer_len) else None
    return {"arrival_seq": state.arrival_seq, "prompt_len": state.prompt_len, "max_tokens": p.max_tokens,
            "block_length": p.block_length, "ignore_eos": p.ignore_eos, "eos_at": eos_at}


class TracingPolicy:
    observes = True

    def __init__(self, inner, trace_dir: str, candidates: tuple[float, ...]):
        self.inner = inner
        self.candidates = candidates
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(trace_dir) / f"trace-{int(time.time())}-{os.getpid()}.jsonl"
        self.file = open(self.path, "a", buffering=1 << 16)
        self.progress: dict[str, Progress] = {}
        self.taus: dict[str, dict[int, float]] = {}

    def _write(self, row: dict) -> None:
        self.file.write(json.dumps(row, separators=(",", ":")) + "\n")

    def block_policy(self, state: RequestState, block_index: int) -> BlockPolicy:
        pol = self.inner.block_policy(state, block_index)
        self._record(state, block_index, pol)
        return pol

    def _record(self, state: RequestState, block_index: int, pol: BlockPolicy) -> None:
        rid = state.request_id
        if rid not in self.progress:
            p = self.progress[rid] = Progress.start(state)
            self._write({"kind": "admit", "rid": rid, "tau": pol.threshold,
                         "x": feature_row(p, pol.threshold, self.candidates)})
        self.taus.setdefault(rid, {})[block_index] = pol.threshold

    def block_policies(self, items: list[tuple[RequestState, int]]) -> list[BlockPolicy]:
        pols = self.inner.block_policies(items)
        for (st, k), pol in zip(items, pols):
            self._record(st, k, pol)
        return pols

    def revise(self, entries, now: float) -> list[tuple[str, int, BlockPolicy]]:
        changes = self.inner.revise(entries, now) if getattr(self.inner, "observes", False) else []
        for rid, k, pol in changes:
            self.taus.setdefault(rid, {})[k] = pol.threshold
        return changes

    def is_hopeless(self, request_id: str) -> bool:
        return self.inner.is_hopeless(request_id)

    def seed(self, worker_id: int, profile) -> None:
        if getattr(self.inner, "observes", False):
            self.inner.seed(worker_id, profile)

    def on_report(self, worker_id: int, report: LoadReport, now: float) -> None:
        if getattr(self.inner, "observes", False):
            self.inner.on_report(worker_id, report, now)

    def on_step(self, state: RequestState, delta: StepDelta, worker_id: int, now: float) -> None:
        rid = state.request_id
        p = self.progress.get(rid) or self.progress.setdefault(rid, Progress.start(state))
        p.observe(delta, state)
        tau = self.taus.get(rid, {}).get(delta.block_index, 0.0)
        self._write({"kind": "step", "rid": rid, "block": delta.block_index, "step": delta.step, "tau": tau,
                     "x": feature_row(p, tau, self.candidates)})
        if getattr(self.inner, "observes", False):
            self.inner.on_step(state, delta, worker_id, now)

    def on_block_done(self, state: RequestState, msg: BlockDone) -> None:
        p = self.progress.get(state.request_id)
        if p is not None:
            p.end_block(msg.num_steps)
        if getattr(self.inner, "observes", False):
            self.inner.on_block_done(state, msg)

    def on_finish(self, state: RequestState, output: GenerationOutput, now: float) -> None:
        rid = state.request_id
        s = output.stats
        self._write({"kind": "end", "rid": rid, "finish": output.finish_reason, "forwards": s.num_forwards,
                     "steps_per_block": s.steps_per_block, "thresholds": [b.threshold for b in s.block_policies],
                     "tokens": len(output.token_ids), **replay_fields(state)})
        self.file.flush()
        self.progress.pop(rid, None)
        self.taus.pop(rid, None)
        if getattr(self.inner, "observes", False):
            self.inner.on_finish(state, output, now)

    def summary(self) -> dict | None:
        return self.inner.summary() if hasattr(self.inner, "summary") else None
