"""One measurement: send a workload on an arrival schedule and assemble its result dict.

Owns: the shared ``httpx.AsyncClient`` (no proxies from the environment), the send loop that
sleeps until each arrival offset, the closed-loop ``--max-concurrency`` semaphore, warm-up
requests (sent first, excluded from results and from the ``/metrics`` deltas), the rich
progress bar, and the before/after scrape of ``/metrics``.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, TypeVar

import httpx

from .client import RequestResult, build_body, request_slo_ms, send_request
from .metrics_scrape import metrics_report, scrape_metrics, server_info
from .report import build_result
from .stats import summarize
from .tokens import TokenCounter
from .workload import RequestSpec

T = TypeVar("T")


@dataclass
class RunConfig:
    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = "completions"
    model: str | None = None
    api_key: str | None = None
    extra_body: dict = field(default_factory=dict)
    ignore_eos: bool = False
    temperature: float | None = None
    timeout_s: float = 600.0
    max_concurrency: int | None = None
    num_warmups: int = 0
    show_progress: bool = True
    slos: dict = field(default_factory=dict)
    slo_ms: float | None = None              # per-request SLO sent as slo_ms: fixed ...
    slo_ms_per_token: float | None = None    # ... or slo_base_ms + this per requested output token
    slo_base_ms: float = 0.0

    def headers(self) -> dict:
        key = self.api_key or os.environ.get("OPENAI_API_KEY")
        return {"Authorization": f"Bearer {key}"} if key else {}


def make_client(cfg: RunConfig) -> httpx.AsyncClient:
    # No pool limit: an open-loop run must never queue inside the client (that time would be
    # charged to TTFT); --max-concurrency bounds connections with its own semaphore.
    return httpx.AsyncClient(
        timeout=httpx.Timeout(cfg.timeout_s, connect=min(30.0, cfg.timeout_s)),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        trust_env=False)


def _progress(enabled: bool, total: int, label: str):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), disable=not enabled)
    return prog, prog.add_task(label, total=total)


async def execute(client: httpx.AsyncClient, cfg: RunConfig, model: str | None,
                  specs: list[RequestSpec], offsets, counter: TokenCounter,
                  label: str = "requests", progress: bool | None = None
                  ) -> tuple[list[RequestResult], float]:
    """Send ``specs[i]`` at ``offsets[i]`` seconds; returns (results in spec order, duration)."""
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    headers = cfg.headers()
    show = cfg.show_progress if progress is None else progress
    prog, task_id = _progress(show, len(specs), label)
    t0 = time.perf_counter()

    async def one(i: int, spec: RequestSpec, offset: float) -> RequestResult:
        res = RequestResult(index=i, prompt_len=spec.prompt_len,
                            expected_output_len=spec.output_len, scheduled=float(offset),
                            slo_ms=request_slo_ms(spec.output_len, cfg.slo_ms, cfg.slo_ms_per_token, cfg.slo_base_ms))
        try:
            body = build_body(spec, cfg.endpoint, model, cfg.ignore_eos, cfg.extra_body,
                              cfg.temperature, res.slo_ms)
        except ValueError as exc:
            res.error, res.start, res.latency = f"bad request: {exc}", time.perf_counter() - t0, 0.0
        else:
            if sem is not None:
                async with sem:
                    await send_request(client, cfg.base_url, cfg.endpoint, body, res, headers, t0)
            else:
                await send_request(client, cfg.base_url, cfg.endpoint, body, res, headers, t0)
        res.client_output_tokens = counter.count(res.text)
        prog.advance(task_id)
        return res

    with prog:
        results = await open_loop(offsets, lambda i: one(i, specs[i], offsets[i]), t0)
    return results, time.perf_counter() - t0


async def open_loop(offsets, one: Callable[[int], Awaitable[T]], t0: float | None = None) -> list[T]:
    """Start ``one(i)`` at ``t0 + offsets[i]`` (perf_counter seconds) whatever earlier requests are
    doing (open loop); returns the results in request order. Shared with the in-process engine
    benchmarks (bench/harness.py)."""
    t0 = time.perf_counter() if t0 is None else t0
    tasks = []
    for i, off in enumerate(offsets):
        delay = t0 + float(off) - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    return list(await asyncio.gather(*tasks))


async def benchmark(cfg: RunConfig, specs: list[RequestSpec], offsets,
                    counter: TokenCounter, warmup_specs: list[RequestSpec] | None = None,
                    echo: dict | None = None, metadata: dict | None = None,
                    label: str = "requests") -> dict:
    """Warm up, scrape, run, scrape; returns the full result dict (see ``report.build_result``)."""
    async with make_client(cfg) as client:
        info = await server_info(client, cfg.base_url, cfg.headers())
        model = cfg.model or (info["models"][0] if info["models"] else None)
        warm = (warmup_specs or [])[: cfg.num_warmups]
        if warm:
            await execute(client, cfg, model, warm, [0.0] * len(warm), counter,
                          label="warm-up", progress=False)
        before = await scrape_metrics(client, cfg.base_url)
        results, duration = await execute(client, cfg, model, specs, offsets, counter, label)
        after = await scrape_metrics(client, cfg.base_url)
    summary = summarize(results, duration, cfg.slos, counter)
    echo = dict(echo or {})
    echo.setdefault("base_url", cfg.base_url)
    echo.setdefault("endpoint", cfg.endpoint)
    echo["model"] = model
    echo["num_warmups_sent"] = len(warm)
    return build_result(echo, info, metadata or {}, summary, results,
                        metrics_report(before, after), counter)
