"""Traffic for the soak and the overload: the capacity search (the load generator's, on a fixed
workload), an open-loop mix of good, cancelled, malformed and over-long requests with the
outcome of each, and a sampler of the server's memory."""
from __future__ import annotations

import dataclasses
import random
import statistics
import threading
import time

import httpx
import numpy as np

from loadgen.arrivals import arrival_offsets
from loadgen.capacity import find_capacity
from loadgen.run import RunConfig, benchmark, open_loop
from loadgen.tokens import TokenCounter
from loadgen.workload import RequestSpec

from .tools import rss_mb, worker_pids

PROMPTS = ["Good morrow, my lord. What news?", "Tell me a story.", "Who art thou?", "What is love?",
           "My lord, the horses are ready.", "Why dost thou frown so?", "Is this a dagger I see?",
           "Pray, tell me of your travels.", "The king is dead, they say.", "What news from Rome?"]
OUTPUT_TOKENS = 32
# Malformed bodies of every kind the suite knows: each must be a 4xx, never a 5xx.
BAD_BODIES = [b"{nope", b"[1, 2]", b'{"prompt": "\xff\xfe"}', b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
              b'{"prompt": "x", "max_tokens": -1}', b'{"prompt": "x", "model": "gpt-9"}',
              b'{"prompt": "x", "stop": ["' + b"s" * 300 + b'"]}', b'{"prompt": "\\ud800"}', b"",
              b'{"messages": []}']
MIX = {"stream": 0.45, "json": 0.25, "cancel": 0.1, "bad": 0.12, "long": 0.08}


@dataclasses.dataclass
class Outcome:
    kind: str
    status: int = 0               # 0: no HTTP status (transport error)
    finish: str | None = None
    error: str = ""
    latency: float = 0.0
    retry_after: str | None = None

    @property
    def label(self) -> str:
        return f"{self.kind} {self.status}" + (f" {self.finish}" if self.finish else "")

    @property
    def is_5xx(self) -> bool:
        return self.status >= 500 or self.finish == "error" or "stream error" in self.error


def fixed_workload(n: int, seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    return [RequestSpec(rng.choice(PROMPTS), 12, OUTPUT_TOKENS) for _ in range(n)]


async def measure_capacity(url: str, unloaded_s: float, requests: int = 24, tolerance: float = 0.25,
                           max_steps: int = 7, seed: int = 0) -> dict:
    """loadgen's capacity search: the highest Poisson rate at which 90 % of `requests` fixed-length
    streamed completions finish within 3x their unloaded latency. Starts from half the rate a
    burst of 16 sustains."""
    specs = fixed_workload(requests, seed)
    slo_ms = 3e3 * unloaded_s
    cfg = RunConfig(base_url=url, show_progress=False, ignore_eos=True, slo_ms=slo_ms)
    burst = await benchmark(cfg, specs[:16], np.zeros(16), TokenCounter())
    start = max(0.25, 0.5 * burst["summary"]["request_throughput"])

    async def at(rate: float) -> dict:
        offsets = arrival_offsets("poisson", rate, len(specs), np.random.default_rng(seed))
        return await benchmark(cfg, specs, offsets, TokenCounter())
    found = await find_capacity(at, lambda r: r["summary"]["slo"]["attainment"] >= 0.9, start_rate=start,
                                tolerance=tolerance, max_steps=max_steps)
    return {"capacity_req_s": found["capacity"] or start / 2, "slo_ms": round(slo_ms, 1),
            "probes": [(round(h["rate"], 2), h["ok"]) for h in found["history"]],
            "burst_req_s": round(burst["summary"]["request_throughput"], 2)}


def _good_body(rng: random.Random, stream: bool) -> tuple[str, dict]:
    body = {"max_tokens": rng.choice([8, 16, 32, 64]), "seed": rng.randrange(1 << 30), "stream": stream}
    if rng.random() < 0.5:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}
    return "/v1/completions", {**body, "prompt": rng.choice(PROMPTS)}


async def _stream(client: httpx.AsyncClient, url: str, path: str, body: dict, out: Outcome,
                  cancel_after: int | None = None) -> None:
    async with client.stream("POST", url + path, json=body) as r:
        out.status, out.retry_after = r.status_code, r.headers.get("retry-after")
        if r.status_code != 200:
            await r.aread()
            return
        events = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return
            events += 1
            if '"error"' in line and '"choices"' not in line:
                out.error = "stream error: " + line[:200]
            elif '"finish_reason":"' in line:
                out.finish = line.split('"finish_reason":"')[1].split('"')[0]
            if cancel_after is not None and events >= cancel_after:
                out.finish = "cancelled"
                return
        out.error = out.error or "stream ended without [DONE]"


async def one_request(client: httpx.AsyncClient, url: str, kind: str, rng: random.Random) -> Outcome:
    out = Outcome(kind)
    t0 = time.monotonic()
    try:
        if kind in ("stream", "cancel"):
            path, body = _good_body(rng, stream=True)
            await _stream(client, url, path, body, out, rng.randint(1, 3) if kind == "cancel" else None)
        elif kind == "json":
            path, body = _good_body(rng, stream=False)
            r = await client.post(url + path, json=body)
            out.status, out.retry_after = r.status_code, r.headers.get("retry-after")
            if r.status_code == 200:
                out.finish = r.json()["choices"][0]["finish_reason"]
        elif kind == "bad":
            r = await client.post(url + "/v1/completions", content=rng.choice(BAD_BODIES),
                                  headers={"Content-Type": "application/json"})
            out.status = r.status_code
        else:                       # "long": past the cheap bound, or past the context after tokenizing
            prompt = "x" * rng.choice([3000, 100_000])
            r = await client.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8})
            out.status = r.status_code
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.latency = time.monotonic() - t0
    return out


async def mixed_traffic(url: str, rate: float, duration_s: float, seed: int = 1, mix: dict | None = None,
                        timeout_s: float = 300.0) -> list[Outcome]:
    """Open loop: Poisson arrivals at `rate` for `duration_s`, each request's kind drawn from `mix`."""
    mix = mix or MIX
    rng = random.Random(seed)
    offsets = [o for o in arrival_offsets("poisson", rate, int(rate * duration_s * 1.5) + 10,
                                          np.random.default_rng(seed)) if o < duration_s]
    kinds = rng.choices(list(mix), weights=list(mix.values()), k=len(offsets))
    # No connection reuse: a kept-alive connection the server closes (its 5 s idle timeout) just
    # as the client picks it up is a transport error of the client's making.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30), limits=limits, trust_env=False) as c:
        return await open_loop(offsets, lambda i: one_request(c, url, kinds[i], random.Random(seed * 100_003 + i)))


def tally(outcomes: list[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.label] = counts.get(o.label, 0) + 1
    return dict(sorted(counts.items()))


def errors(outcomes: list[Outcome]) -> dict[str, int]:
    """Requests that got no HTTP status, by the client's exception."""
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.status == 0:
            kind = o.error.split(":", 1)[0] or "no status"
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


class MemorySampler:
    """RSS of the front process and of its workers (summed), every `every_s`, from a thread."""

    def __init__(self, server_pid: int, every_s: float = 1.0):
        self.pid, self.every_s = server_pid, every_s
        self.samples: list[tuple[float, float, float]] = []      # (at, front MB, workers MB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            front = rss_mb(self.pid)
            workers = sum(rss_mb(p) or 0.0 for p in worker_pids(self.pid))
            if front is not None:
                self.samples.append((time.monotonic(), front, workers))
            self._stop.wait(self.every_s)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def growth(self, warmup_s: float) -> dict:
        """RSS right after the warm-up vs at the end (medians of a few samples each), in MB and %."""
        t0 = self.samples[0][0]
        after = [s for s in self.samples if s[0] - t0 >= warmup_s]
        head, tail = after[:5], after[-5:]
        out = {}
        for i, name in ((1, "front"), (2, "workers")):
            a, b = statistics.median(s[i] for s in head), statistics.median(s[i] for s in tail)
            out[f"{name}_rss_mb"] = [round(a, 1), round(b, 1)]
            out[f"{name}_rss_growth_pct"] = round(100 * (b - a) / a, 2) if a else None
        out["front_rss_peak_mb"] = round(max(s[1] for s in self.samples), 1)
        return out
