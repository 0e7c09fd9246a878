"""Result files and the terminal report.

Owns: the JSON result layout (config echo, server info, machine, metadata, summary, errors,
``/metrics`` deltas, and every per-request array), writing it, and printing the rich tables.
"""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from .stats import error_digest, tpot

# dLLM knobs echoed from --extra-body when present.
DLLM_KEYS = ("threshold", "factor", "steps", "block_length", "remasking", "cache",
             "ignore_eos", "temperature", "max_tokens", "alg", "alg_temp")


def machine_info() -> dict:
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": sys.version.split()[0], "machine": platform.machine()}


def per_request_arrays(results) -> dict:
    """Index-aligned arrays, seconds; None where a failed request has no value."""
    return {
        "ok": [r.ok for r in results],
        "start_times": [r.start for r in results],
        "scheduled_times": [r.scheduled for r in results],
        "ttfts": [r.ttft for r in results],
        "itls": [r.itls for r in results],
        "tpots": [tpot(r) for r in results],
        "latencies": [r.latency for r in results],
        "prompt_lens": [r.prompt_len for r in results],
        "expected_output_lens": [r.expected_output_len for r in results],
        "output_lens": [r.output_tokens if r.ok else 0 for r in results],
        "usage_output_tokens": [r.usage_output_tokens for r in results],
        "usage_prompt_tokens": [r.usage_prompt_tokens for r in results],
        "client_output_tokens": [r.client_output_tokens for r in results],
        "finish_reasons": [r.finish_reason for r in results],
        "progress_chunks": [r.progress_chunks for r in results],
        "http_status": [r.status for r in results],
        "errors": [r.error for r in results],
        "texts": [r.text for r in results],
        "slo_ms": [r.slo_ms for r in results],
        "thresholds": [r.thresholds for r in results],
    }


def build_result(echo: dict, server: dict, metadata: dict, summary: dict, results,
                 server_metrics: dict, counter=None) -> dict:
    extra = echo.get("extra_body") or {}
    echo = {**echo, "dllm_params": {k: extra[k] for k in DLLM_KEYS if k in extra}}
    arrays = per_request_arrays(results)
    if counter is not None:
        arrays["token_mismatch"] = [r.ok and counter.mismatch(r.client_output_tokens,
                                                               r.usage_output_tokens)
                                    for r in results]
    return {"config": echo, "server": server, "machine": machine_info(),
            "metadata": metadata, "summary": summary, "errors": error_digest(results),
            "server_metrics": server_metrics, "requests": arrays}


def write_result(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1, default=str)
    return path


def _fmt(x, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _console():
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=140)


def print_report(result: dict, console=None) -> None:
    from rich.table import Table

    console = console or _console()
    cfg, s, server = result["config"], result["summary"], result["server"]
    head = Table(title="loadgen run", show_header=False)
    for key in ("base_url", "endpoint", "model", "dataset", "num_prompts", "seed", "arrival",
                "request_rate", "burstiness", "max_concurrency"):
        head.add_row(key, _fmt(cfg.get(key)))
    head.add_row("server version", _fmt(server.get("version")))
    head.add_row("dLLM params", json.dumps(cfg.get("dllm_params") or {}))
    m = result["machine"]
    head.add_row("machine", f"{m['cpu_count']} CPUs, {m['platform']}")
    console.print(head)

    tp = Table(title="throughput", show_header=False)
    rows = [("successful / failed", f"{s['completed']} / {s['failed']}"),
            ("duration (s)", _fmt(s["duration_s"])),
            ("request throughput (req/s)", _fmt(s["request_throughput"], 3)),
            ("output throughput (tok/s)", _fmt(s["output_throughput"])),
            ("total token throughput (tok/s)", _fmt(s["total_token_throughput"])),
            ("peak output throughput (tok/s, 1 s buckets)", _fmt(s["peak_output_throughput"])),
            ("achieved concurrency", _fmt(s["achieved_concurrency"])),
            ("peak concurrency", _fmt(s["peak_concurrency"])),
            ("input / output tokens", f"{s['total_input_tokens']} / {s['total_output_tokens']}"),
            (f"token mismatches ({s['token_count_method']})", _fmt(s["token_mismatches"]))]
    if "slo" in s:
        o = s["slo"]
        mean_t = "-" if o["mean_threshold"] is None else f"{o['mean_threshold']:.3f}"
        rows.append(("per-request SLO attainment", f"{100 * o['attainment']:.1f}% ({o['met']}/{o['requests']}), "
                     f"goodput {o['goodput_req_s']:.3f} req/s, mean block threshold {mean_t}"))
    if "goodput" in s:
        g = s["goodput"]
        slo = " ".join(f"{k}<={v:g}ms" for k, v in g["slos_ms"].items())
        rows.append((f"goodput (req/s, {slo})",
                     f"{g['request_goodput']:.3f} ({100 * g['fraction']:.1f}% of requests)"))
    for k, v in rows:
        tp.add_row(k, v)
    console.print(tp)

    lat = Table(title="latency (ms)")
    for col in ("metric", "mean", "median", "p90", "p99", "max", "n"):
        lat.add_column(col, justify="right" if col != "metric" else "left")
    for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"),
                      ("inter-chunk", "inter_chunk_ms"), ("E2E", "e2el_ms")):
        d = s[key]
        lat.add_row(name, *(_fmt(d[k]) for k in ("mean", "median", "p90", "p99", "max")),
                    str(d["count"]))
    console.print(lat)

    errs = result["errors"]
    if errs["count"]:
        console.print(f"[red]{errs['count']} failed requests, {errs['distinct']} distinct errors:")
        for e in errs["first_distinct"]:
            console.print(f"  x{e['count']}: {e['message']}")
    sm = result["server_metrics"]
    if not sm["available"]:
        console.print(f"server /metrics: not available ({sm['note']})")
    elif sm["deltas"]:
        mt = Table(title="server dllm: counters (after - before)", show_header=False)
        for k, v in sm["deltas"].items():
            mt.add_row(k, _fmt(v, 3))
        console.print(mt)
    else:
        console.print("server /metrics: no dllm: counters")


def print_sweep(rows: list[dict], console=None) -> None:
    from rich.table import Table

    console = console or _console()
    t = Table(title="rate sweep")
    for col in ("rate", "req/s", "out tok/s", "ok/fail", "TTFT p50 ms", "TTFT p99 ms",
                "TPOT p50 ms", "E2E p50 ms", "E2E p99 ms", "goodput %", "SLO %", "mean thr"):
        t.add_column(col, justify="right")
    for r in rows:
        s = r["summary"]
        g = s.get("goodput")
        t.add_row(_fmt(r["config"].get("request_rate")), _fmt(s["request_throughput"], 3),
                  _fmt(s["output_throughput"]), f"{s['completed']}/{s['failed']}",
                  _fmt(s["ttft_ms"]["median"], 1), _fmt(s["ttft_ms"]["p99"], 1),
                  _fmt(s["tpot_ms"]["median"], 1), _fmt(s["e2el_ms"]["median"], 1),
                  _fmt(s["e2el_ms"]["p99"], 1), "-" if g is None else f"{100 * g['fraction']:.1f}",
                  "-" if "slo" not in s else f"{100 * s['slo']['attainment']:.1f}",
                  "-" if "slo" not in s or s["slo"]["mean_threshold"] is None else f"{s['slo']['mean_threshold']:.3f}")
    console.print(t)
