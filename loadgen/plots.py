"""PNG plots with matplotlib (Agg backend, no display needed).

Owns: latency-vs-rate curves for a sweep or capacity search (TTFT, TPOT, E2E: median and p99,
plus achieved throughput) and the latency CDF (TTFT and E2E, one curve per rate).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_vs_rate(results: list[dict], path: str | Path, title: str = "") -> Path:
    """One panel per metric (median solid, p99 dashed) against the offered rate."""
    plt = _plt()
    rows = sorted(results, key=lambda r: float(r["config"]["request_rate"]))
    rates = [float(r["config"]["request_rate"]) for r in rows]
    with_slo = any("slo" in r["summary"] for r in rows)
    fig, axes = plt.subplots(1, 5 if with_slo else 4, figsize=(20 if with_slo else 16, 3.8))
    for ax, (name, key) in zip(axes, (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"),
                                      ("E2E latency", "e2el_ms"))):
        for stat, style in (("median", "-o"), ("p99", "--s")):
            ys = [r["summary"][key][stat] for r in rows]
            ys = [np.nan if y is None else y for y in ys]
            ax.plot(rates, ys, style, label=stat)
        ax.set_title(name)
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
        ax.legend()
    ax = axes[3]
    ax.plot(rates, [r["summary"]["request_throughput"] for r in rows], "-o", label="achieved")
    ax.plot(rates, rates, ":", color="grey", label="offered")
    ax.set_title("throughput")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("completed req/s")
    ax.grid(alpha=0.3)
    ax.legend()
    if with_slo:
        ax = axes[4]
        ax.plot(rates, [100 * r["summary"].get("slo", {}).get("attainment", np.nan) for r in rows], "-o",
                label="SLO attainment")
        ax.set_ylim(0, 105)
        ax.set_title("per-request SLO")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("% of requests within their SLO")
        ax.grid(alpha=0.3)
    return _save(plt, fig, path, title)


def plot_latency_cdf(results: list[dict], path: str | Path, title: str = "") -> Path:
    """Empirical CDFs of TTFT and E2E latency (ms) of successful requests, one line per rate."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for r in results:
        req = r["requests"]
        label = f"{r['config'].get('request_rate')} req/s"
        for ax, key in zip(axes, ("ttfts", "latencies")):
            v = np.sort([x * 1000.0 for x, ok in zip(req[key], req["ok"]) if ok and x is not None])
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label)
    for ax, name in zip(axes, ("TTFT", "E2E latency")):
        ax.set_title(f"{name} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _save(plt, fig, path, title)


def _save(plt, fig, path: str | Path, title: str) -> Path:
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
