"""Pure statistics over finished requests: the numbers in the report and the JSON summary.

Owns: per-request TPOT, percentiles, throughput (req/s, output and total tok/s, peak output tok/s
in 1 s buckets), achieved and peak concurrency, goodput against SLOs, the error digest and the
client/server token-count mismatch count. No I/O.

Conventions: per-request arrays are seconds; summary latencies are milliseconds.
TPOT = (e2e - ttft) / (output_tokens - 1), defined for requests with >= 2 output tokens.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .client import RequestResult

SLO_KEYS = ("ttft", "tpot", "e2el")


def tpot(r: RequestResult) -> float | None:
    n = r.output_tokens
    if not r.ok or r.latency is None or r.ttft is None or n < 2:
        return None
    return (r.latency - r.ttft) / (n - 1)


def describe_ms(values_s) -> dict:
    """mean/median/p90/p99/max (ms) and count of the non-None values (seconds)."""
    v = np.array([x for x in values_s if x is not None], dtype=float) * 1000.0
    if v.size == 0:
        return {"count": 0, "mean": None, "median": None, "p90": None, "p99": None, "max": None}
    return {"count": int(v.size), "mean": float(v.mean()), "median": float(np.median(v)),
            "p90": float(np.percentile(v, 90)), "p99": float(np.percentile(v, 99)),
            "max": float(v.max())}


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or []:
        for part in item.replace(",", " ").split():
            key, sep, val = part.partition(":")
            if not sep or key not in SLO_KEYS:
                raise ValueError(f"bad --goodput item {part!r}; use {'/'.join(SLO_KEYS)}:MS")
            slos[key] = float(val)
            if slos[key] <= 0:
                raise ValueError(f"SLO {key} must be > 0 ms")
    return slos


def meets_slo(r: RequestResult, slos: dict[str, float]) -> bool:
    """The --goodput SLOs and the request's own SLO (slo_ms), when it has one."""
    if not r.ok:
        return False
    got = {"ttft": r.ttft, "tpot": tpot(r) or 0.0, "e2el": r.latency}
    if r.slo_ms is not None and (r.latency is None or r.latency * 1000.0 > r.slo_ms):
        return False
    return all(got[k] is not None and got[k] * 1000.0 <= ms for k, ms in slos.items())


def slo_summary(results: list[RequestResult], duration: float) -> dict | None:
    """Per-request SLOs: the share of requests that finished within their own SLO (failed ones
    miss it), the goodput they make, and the mean threshold the server's blocks ran with."""
    with_slo = [r for r in results if r.slo_ms is not None]
    if not with_slo:
        return None
    good = [r for r in with_slo if r.ok and r.latency is not None and r.latency * 1000.0 <= r.slo_ms]
    thresholds = [t for r in results if r.ok and r.thresholds for t in r.thresholds]
    return {"requests": len(with_slo), "met": len(good), "attainment": len(good) / len(with_slo),
            "goodput_req_s": len(good) / max(duration, 1e-9),
            "slo_ms": describe_ms(r.slo_ms / 1000.0 for r in with_slo),
            "mean_threshold": sum(thresholds) / len(thresholds) if thresholds else None}


def peak_output_rate(results: list[RequestResult], bucket_s: float = 1.0) -> float:
    """Max output tokens landing in any ``bucket_s`` bucket, per second.

    A request's output tokens are spread over its content chunks in proportion to their
    characters (the server only reports a total), each at the chunk's arrival time.
    """
    buckets: Counter = Counter()
    for r in results:
        if not r.ok or not r.chunk_times:
            continue
        chars = sum(r.chunk_chars)           # every stored chunk has >= 1 character
        for t, c in zip(r.chunk_times, r.chunk_chars):
            buckets[math.floor((r.start + t) / bucket_s)] += r.output_tokens * c / chars
    return max(buckets.values()) / bucket_s if buckets else 0.0


def peak_concurrency(results: list[RequestResult]) -> int:
    events = []
    for r in results:
        if r.latency is None:
            continue
        events.append((r.start, 1))
        events.append((r.start + r.latency, -1))
    events.sort(key=lambda e: (e[0], e[1]))      # ends before starts at equal times
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def error_digest(results: list[RequestResult], limit: int = 10) -> dict:
    msgs = Counter(r.error for r in results if not r.ok)
    first = []
    for r in results:
        if not r.ok and r.error not in [f["message"] for f in first]:
            first.append({"message": r.error, "count": msgs[r.error]})
            if len(first) >= limit:
                break
    return {"count": sum(msgs.values()), "distinct": len(msgs), "first_distinct": first}


def summarize(results: list[RequestResult], duration: float, slos: dict[str, float],
              counter=None) -> dict:
    """The summary block of a result file."""
    ok = [r for r in results if r.ok]
    dur = max(duration, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.usage_prompt_tokens if r.usage_prompt_tokens is not None else r.prompt_len
                    for r in ok)
    mismatches = sum(1 for r in ok if counter is not None
                     and counter.mismatch(r.client_output_tokens, r.usage_output_tokens))
    summary = {
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "total_input_tokens": int(in_tokens),
        "total_output_tokens": int(out_tokens),
        "request_throughput": len(ok) / dur,
        "output_throughput": out_tokens / dur,
        "total_token_throughput": (in_tokens + out_tokens) / dur,
        "peak_output_throughput": peak_output_rate(results),
        "achieved_concurrency": sum(r.latency or 0.0 for r in results) / dur,
        "peak_concurrency": peak_concurrency(results),
        "ttft_ms": describe_ms(r.ttft for r in ok),
        "tpot_ms": describe_ms(tpot(r) for r in ok),
        "inter_chunk_ms": describe_ms(x for r in ok for x in r.itls),
        "e2el_ms": describe_ms(r.latency for r in ok),
        "usage_missing": sum(1 for r in ok if r.usage_output_tokens is None),
        "empty_outputs": sum(1 for r in ok if not r.text),
        "token_count_method": counter.method if counter is not None else None,
        "token_mismatches": mismatches,
        "progress_chunks": sum(r.progress_chunks for r in results),
    }
    slo = slo_summary(results, duration)
    if slo is not None:
        summary["slo"] = slo
    if slos or slo is not None:
        good = sum(1 for r in results if meets_slo(r, slos))
        summary["goodput"] = {"slos_ms": slos, "good_requests": good,
                              "request_goodput": good / dur,
                              "fraction": good / len(results) if results else 0.0}
    return summary
