"""Arrival processes: when each request is sent, as pure functions of (rate, n, seeded Generator).

Owns: Poisson (exponential gaps, never truncated), gamma with burstiness, constant rate,
the "all at once" schedule used by closed-loop max-concurrency runs, and reading a timestamped
trace file (JSONL) into arrival offsets. Nothing here sleeps or touches the network; ``run.py``
turns the offsets into wall-clock sends.

All offsets are seconds from the start of the run, non-decreasing, first request at 0.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARRIVAL_KINDS = ("poisson", "gamma", "constant")


def _check_rate(rate: float) -> None:
    if not (rate > 0):
        raise ValueError(f"request rate must be > 0 (or inf), got {rate}")


def poisson_gaps(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` inter-arrival gaps of a Poisson process: i.i.d. Exponential(mean=1/rate)."""
    _check_rate(rate)
    if math.isinf(rate):
        return np.zeros(n)
    return rng.exponential(scale=1.0 / rate, size=n)


def gamma_gaps(rate: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Gamma gaps with shape=burstiness, scale=1/(rate*burstiness).

    Mean gap stays 1/rate; the coefficient of variation is 1/sqrt(burstiness): burstiness < 1
    is burstier than Poisson, > 1 smoother, == 1 is exactly Poisson.
    """
    _check_rate(rate)
    if not (burstiness > 0):
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if math.isinf(rate):
        return np.zeros(n)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def constant_gaps(rate: float, n: int) -> np.ndarray:
    """Deterministic gaps of exactly 1/rate."""
    _check_rate(rate)
    if math.isinf(rate):
        return np.zeros(n)
    return np.full(n, 1.0 / rate)


def offsets_from_gaps(gaps: np.ndarray) -> np.ndarray:
    """Turn n gaps into n send offsets with the first request at 0 (the first gap is dropped)."""
    gaps = np.asarray(gaps, dtype=float)
    if gaps.size == 0:
        return gaps
    out = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    return out


def arrival_offsets(kind: str, rate: float, n: int, rng: np.random.Generator,
                    burstiness: float = 1.0) -> np.ndarray:
    """Send offsets (seconds) for ``n`` requests of the named process at ``rate`` req/s."""
    if kind == "poisson":
        gaps = poisson_gaps(rate, n, rng)
    elif kind == "gamma":
        gaps = gamma_gaps(rate, burstiness, n, rng)
    elif kind == "constant":
        gaps = constant_gaps(rate, n)
    else:
        raise ValueError(f"unknown arrival process {kind!r}; choose from {ARRIVAL_KINDS}")
    return offsets_from_gaps(gaps)


# --------------------------------------------------------------------------- traces

@dataclass(frozen=True)
class TraceEntry:
    """One line of a replay trace."""
    timestamp: float
    output_len: int
    prompt: str | None = None
    prompt_len: int | None = None


def parse_trace_lines(lines) -> list[TraceEntry]:
    """Parse JSONL lines (``timestamp``, ``prompt`` or ``prompt_len``, ``output_len``).

    Blank lines and lines starting with '#' are skipped; entries are sorted by timestamp.
    """
    entries: list[TraceEntry] = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            obj = json.loads(line)
            ts = float(obj["timestamp"])
            out_len = int(obj["output_len"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"trace line {lineno}: need timestamp and output_len ({exc})") from exc
        prompt = obj.get("prompt")
        plen = obj.get("prompt_len")
        if prompt is None and plen is None:
            raise ValueError(f"trace line {lineno}: need 'prompt' or 'prompt_len'")
        entries.append(TraceEntry(ts, out_len, prompt, None if plen is None else int(plen)))
    entries.sort(key=lambda e: e.timestamp)
    return entries


def load_trace(path: str | Path) -> list[TraceEntry]:
    with open(path, encoding="utf-8") as fh:
        return parse_trace_lines(fh)


def trace_offsets(entries: list[TraceEntry], speed: float = 1.0) -> np.ndarray:
    """Offsets relative to the first timestamp, compressed by ``speed`` (2.0 = twice as fast)."""
    if not (speed > 0):
        raise ValueError(f"trace speed must be > 0, got {speed}")
    if not entries:
        return np.zeros(0)
    ts = np.array([e.timestamp for e in entries], dtype=float)
    return (ts - ts[0]) / speed
