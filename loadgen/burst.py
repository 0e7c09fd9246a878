"""A BurstGPT-like trace: bursty arrivals with ShareGPT-like lengths, written in the replay trace
format (JSONL: ``timestamp``, ``prompt_len``, ``output_len``; read by ``arrivals.parse_trace_lines``,
replayed by the load generator and by the simulator's ``sim/workload.py trace_workload``).

Owns: piecewise-stationary Gamma arrivals (phases of (duration_s, rate req/s), each a renewal
process with Gamma gaps of the given shape: mean 1/rate, CV 1/sqrt(shape), so shape 0.5 gives CV
1.41 and 0.25 gives CV 2, burstier than Poisson's 1); lengths from the load generator's ShareGPT
preset (``workload.PRESETS``, lognormal by median and spread) fitted to a context; the trace's
rows and file; a converter for the real trace's CSV.

BurstGPT (HPMLL/BurstGPT, arXiv 2401.17644) is Azure OpenAI regional traffic, one CSV row per
request (``Timestamp``, ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``,
``Log Type``). That CSV is not reachable from this machine, so this module *synthesises* a trace
of its shape (its authors' own generator also draws Gamma gaps per time window); the lengths are
ShareGPT's, not BurstGPT's. A user with the CSV converts it with ``from_burstgpt_csv`` to the same
JSONL and replays it unchanged. Every row carries its ``phase`` (extra keys are ignored by readers).

    python -m loadgen.burst --out burst.jsonl --reference-rate 10 --scales 0.3,0.9,1.4,0.5 \\
        --phase-s 300 --shape 0.5 --seed 0 [--phase-lengths 3:0.5,0.5:3,3:0.5,0.5:3]
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from .arrivals import gamma_gaps
from .workload import fit_lengths, preset_lengths

DEFAULT_SCALES = (0.3, 0.9, 1.4, 0.5)     # of a reference rate (e.g. a layout's capacity)
DEFAULT_PHASE_S = 300.0                  # 4 phases x 5 min
DEFAULT_SHAPE = 0.5                      # Gamma shape: CV 1.41


def scaled_phases(reference_rate: float, scales: Sequence[float] = DEFAULT_SCALES,
                  phase_s: float = DEFAULT_PHASE_S) -> list[tuple[float, float]]:
    """(duration_s, rate) per phase: each scale times the reference rate, every phase as long."""
    return [(float(phase_s), float(reference_rate) * s) for s in scales]


def phase_arrivals(phases: Sequence[tuple[float, float]], shape: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times s, phase index) for phases of (duration_s, rate). Within a phase a renewal
    process with Gamma(shape) gaps at its rate; the first phase starts with an arrival at 0, each
    later one restarts at its boundary (the gap running across it is dropped), so every phase's
    mean rate is its own."""
    times, index = [], []
    start = 0.0
    for k, (duration, rate) in enumerate(phases):
        if duration <= 0:
            raise ValueError(f"phase {k}: duration must be > 0, got {duration}")
        end = start + duration
        if rate > 0:
            t = [0.0] if k == 0 else []
            last = start
            expected = max(16, int(rate * duration * 1.2) + 16)   # gaps drawn in chunks until past the end
            while True:
                gaps = gamma_gaps(rate, shape, expected, rng)
                at = last + np.cumsum(gaps)
                keep = at[at < end]
                t.extend(keep.tolist())
                if len(keep) < len(at):
                    break
                last = float(at[-1])
            times += t
            index += [k] * len(t)
        start = end
    return np.asarray(times, dtype=float), np.asarray(index, dtype=int)


def burst_rows(phases: Sequence[tuple[float, float]], shape: float = DEFAULT_SHAPE, seed: int = 0,
               preset: str = "sharegpt", length_scale: float = 1.0, max_len: int | None = 4096,
               phase_lengths: Sequence[tuple[float, float]] | None = None) -> list[dict]:
    """The trace's rows, in time order: timestamp (s), prompt_len, output_len (ShareGPT-like,
    prompt + output fitted to `max_len`), phase. Seeded: the same arguments give the same rows.
    `phase_lengths`: per phase, (prompt, output) length multipliers (a long-prompt phase, a
    long-answer one); the draws are the same, so (1, 1) everywhere gives the plain trace."""
    if phase_lengths is not None and len(phase_lengths) != len(phases):
        raise ValueError(f"phase_lengths: {len(phase_lengths)} pairs for {len(phases)} phases")
    rng = np.random.default_rng(seed)
    times, phase = phase_arrivals(phases, shape, rng)
    prompts, outputs = preset_lengths(preset, len(times), rng, length_scale)
    rows = []
    for t, k, p, o in zip(times.tolist(), phase.tolist(), prompts.tolist(), outputs.tolist()):
        if phase_lengths is not None:      # lognormal: scaling a draw is drawing at a scaled median
            p, o = max(1, round(p * phase_lengths[k][0])), max(1, round(o * phase_lengths[k][1]))
        p, o = fit_lengths(p, o, max_len)
        rows.append({"timestamp": round(t, 6), "prompt_len": int(p), "output_len": int(o), "phase": int(k)})
    return rows


def parse_phase_lengths(text: str) -> list[tuple[float, float]]:
    """"3:0.5,0.5:3" -> [(3.0, 0.5), (0.5, 3.0)]: per phase, prompt and output length multipliers."""
    out = []
    for pair in text.split(","):
        p, sep, o = pair.partition(":")
        try:
            lengths = (float(p), float(o))
        except ValueError:
            lengths = None
        if not sep or lengths is None or min(lengths) <= 0:
            raise ValueError(f"phase lengths: {pair!r} is not prompt:output with both > 0")
        out.append(lengths)
    return out


def write_jsonl(rows: list[dict], path: str | Path, header: str | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        if header:
            fh.write("".join(f"# {line}\n" for line in header.splitlines()))
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def from_burstgpt_csv(path: str | Path, speed: float = 1.0, skip_failed: bool = True,
                      model: str | None = None) -> list[dict]:
    """The real BurstGPT CSV as trace rows: ``Timestamp`` (s) / speed, ``Request tokens`` as the
    prompt length, ``Response tokens`` as the output length; failed requests (0 response tokens)
    left out unless `skip_failed` is False; optionally one ``Model`` (ChatGPT or GPT-4) only."""
    rows = []
    with open(path, newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if model is not None and r.get("Model") != model:
                continue
            out = int(float(r["Response tokens"]))
            if out <= 0 and skip_failed:
                continue
            rows.append({"timestamp": float(r["Timestamp"]) / speed, "prompt_len": max(1, int(float(r["Request tokens"]))),
                         "output_len": max(1, out)})
    rows.sort(key=lambda r: r["timestamp"])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadgen.burst", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSONL trace to write")
    ap.add_argument("--reference-rate", type=float, default=10.0, help="req/s the scales multiply")
    ap.add_argument("--scales", default=",".join(map(str, DEFAULT_SCALES)), help="each phase's rate / reference")
    ap.add_argument("--phase-s", type=float, default=DEFAULT_PHASE_S, help="seconds per phase")
    ap.add_argument("--shape", type=float, default=DEFAULT_SHAPE, help="Gamma shape (0.5: CV 1.41; 0.25: CV 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-len", type=int, default=4096, help="fit prompt + output to this context")
    ap.add_argument("--length-scale", type=float, default=1.0)
    ap.add_argument("--phase-lengths", help="per phase, prompt:output length multipliers, e.g. 3:0.5,0.5:3")
    ap.add_argument("--from-csv", help="convert this BurstGPT CSV instead of synthesising")
    ap.add_argument("--speed", type=float, default=1.0, help="--from-csv: time compression")
    a = ap.parse_args(argv)
    if a.from_csv:
        rows = from_burstgpt_csv(a.from_csv, a.speed)
        header = f"converted from {a.from_csv} (BurstGPT CSV), speed {a.speed}"
    else:
        phases = scaled_phases(a.reference_rate, [float(s) for s in a.scales.split(",")], a.phase_s)
        lengths = parse_phase_lengths(a.phase_lengths) if a.phase_lengths else None
        rows = burst_rows(phases, a.shape, a.seed, length_scale=a.length_scale, max_len=a.max_len,
                          phase_lengths=lengths)
        header = (f"SYNTHETIC BurstGPT-like trace (loadgen/burst.py): phases (s, req/s) {phases}, Gamma shape "
                  f"{a.shape}, ShareGPT preset lengths x {a.length_scale}"
                  + (f", per phase prompt:output x {a.phase_lengths}" if lengths else "")
                  + f", max_len {a.max_len}, seed {a.seed}")
    write_jsonl(rows, a.out, header)
    print(f"{len(rows)} requests -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
