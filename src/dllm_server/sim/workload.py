"""Simulated workloads drawn with loadgen's own presets, traces and arrival processes. By default (Sangam's
accounting) a request asks for exactly its output length; with `max_tokens`, it asks for that cap and ends at
an EOS (the realistic canvas: the mask buffer up to the cap is in every re-prefill)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from loadgen.arrivals import arrival_offsets, load_trace, trace_offsets
from loadgen.tokens import TokenCounter
from loadgen.workload import fit_lengths, preset_lengths

from .behaviour import SimRequest


def _request(at: float, prompt_len: int, output_len: int, max_tokens: int | None,
             threshold: float | None) -> SimRequest:
    if max_tokens is None:
        return SimRequest(float(at), int(prompt_len), max(1, int(output_len)), None, True, threshold)
    eos_at = int(output_len) if output_len < max_tokens else None
    return SimRequest(float(at), int(prompt_len), int(max_tokens), eos_at, False, threshold)


def preset_workload(preset: str, n: int, rate: float, seed: int = 0, arrival: str = "poisson",
                    burstiness: float = 1.0, max_tokens: int | None = None, max_len: int | None = None,
                    length_scale: float = 1.0, threshold: float | None = None) -> list[SimRequest]:
    """`n` requests of a loadgen preset at `rate` req/s, fitted to `max_len` as loadgen does."""
    rng = np.random.default_rng(seed)
    prompts, outputs = preset_lengths(preset, n, rng, length_scale)
    offsets = arrival_offsets(arrival, rate, n, rng, burstiness)
    out = []
    for at, p, o in zip(offsets.tolist(), prompts.tolist(), outputs.tolist()):
        if max_len is not None and max_tokens is None:
            p, o = fit_lengths(p, o, max_len)
        elif max_len is not None:                # the whole cap is on the canvas
            p = max(1, min(p, max_len - max_tokens))
        out.append(_request(at, p, o, max_tokens, threshold))
    return out


def trace_workload(path: str | Path, rate: float | None = None, max_tokens: int | None = None,
                   threshold: float | None = None) -> list[SimRequest]:
    """A loadgen replay trace, its time axis rescaled to `rate` req/s; text prompts count one token per word."""
    entries = load_trace(path)
    if not entries:
        return []
    natural = len(entries) / max(1e-9, entries[-1].timestamp - entries[0].timestamp) if len(entries) > 1 else 1.0
    offsets = trace_offsets(entries, 1.0 if rate is None else rate / natural)
    counter = TokenCounter()
    return [_request(at, e.prompt_len if e.prompt_len is not None else counter.count(e.prompt), e.output_len,
                     max_tokens, threshold) for at, e in zip(offsets.tolist(), entries)]


def rescale(requests: list[SimRequest], rate: float) -> list[SimRequest]:
    """The same requests at another mean rate, for capacity searches over a fixed set."""
    if len(requests) < 2:
        return list(requests)
    span = requests[-1].arrival_s - requests[0].arrival_s
    factor = (len(requests) - 1) / rate / span if span > 0 else 0.0
    return [dataclasses.replace(r, arrival_s=r.arrival_s * factor) for r in requests]
