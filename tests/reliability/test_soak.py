"""Soak and overload on one server. Its capacity is measured first (the load generator's search);
the soak then sends mixed traffic (streams, JSON, streams cancelled mid-way, malformed bodies,
over-long prompts) at 70 % of it for DLLM_SOAK_S seconds (30 here; `make soak`: 600, on the demo
model), and the overload 10x capacity for 6 s (30 s in the long form). Figures: outcomes, 5xx, what is left in flight
and in the KV pool after, RSS growth after warm-up, refusals, recovery time."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from .conftest import start
from .tools import PROBE, Probe, metrics, ms, quiet, unloaded
from .rawclient import overload_traffic
from .traffic import MemorySampler, errors, measure_capacity, mixed_traffic, tally

# CI: 30 s (the whole suite must stay within about 3 minutes); the long form 600 s.
SOAK_S = float(os.environ.get("DLLM_SOAK_S", "30"))
LONG = SOAK_S > 120
OVERLOAD_S = 30.0 if LONG else 6.0
# Room for the bursts of a Poisson soak on a shared machine (whose capacity moves with its load)
# without a 503, small enough that 10x capacity reaches it within a second.
QUEUE_CAP = 256


@pytest.fixture(scope="module")
def soaked(tiny_llada, tmp_path_factory):
    """The server (the demo model for the long form, the tiny random checkpoint in CI) and its
    capacity, measured."""
    name = os.environ.get("DLLM_SOAK_MODEL", "demo" if LONG else "tiny")
    s = start(None if name == "demo" else tiny_llada, "--max-waiting-requests", str(QUEUE_CAP),
              tmp_path=tmp_path_factory.mktemp("soak"))
    base = unloaded(s.url, body={**PROBE, "max_tokens": 32, "ignore_eos": True})
    cap = asyncio.run(measure_capacity(s.url, base, requests=48 if LONG else 24))
    yield s, base, cap, name
    s.stop()


@pytest.mark.timeout(SOAK_S + 300)
def test_soak_mixed_traffic_at_70_percent_of_capacity(soaked, figures):
    s, base, cap, name = soaked
    # 70 % of the lower of the two measures: the search's 24-request Poisson probes last a fraction of
    # a second at the tiny model's rates and can read high (119 req/s in one CI run whose soak at
    # 70 % of that, 84 req/s, filled the 256-deep queue: 503s), the 16-request burst's throughput
    # (68 req/s there) is what the server sustained for a while
    rate = 0.7 * min(cap["capacity_req_s"], cap["burst_req_s"])
    warmup_s = min(60.0, SOAK_S / 4)
    t0 = time.monotonic()
    with MemorySampler(s.pid, every_s=2.0 if LONG else 1.0) as mem:
        outcomes = asyncio.run(mixed_traffic(s.url, rate, SOAK_S))
        assert quiet(s.url, 60), metrics(s.url)
    m = metrics(s.url)
    fives = [o for o in outcomes if o.is_5xx]
    figures("capacity", model=name, unloaded_ms=round(1e3 * base, 1), **cap)
    figures("soak", duration_s=SOAK_S, wall_s=round(time.monotonic() - t0, 1), rate_req_s=round(rate, 2),
            requests=len(outcomes), outcomes=tally(outcomes), five_xx=len(fives),
            kv_cache_usage_after=m["dllm:kv_cache_usage_perc"], running_after=m["dllm:num_requests_running"],
            waiting_after=m["dllm:num_requests_waiting"], warmup_s=warmup_s, **mem.growth(warmup_s),
            rss_goal_pct=5, transport_errors=sum(1 for o in outcomes if o.status == 0), server_tracebacks=tracebacks(s))
    assert not fives, [(o.label, o.error) for o in fives[:5]]
    # Clients that leave mid-stream once made the server log a traceback each (sse.py).
    assert tracebacks(s) == 0, s.log_path
    for o in outcomes:
        if o.kind in ("stream", "json"):
            assert o.status == 200 and o.finish in ("stop", "length"), (o.label, o.error)
        elif o.kind == "cancel":
            assert o.status == 200, (o.label, o.error)
        else:
            assert 400 <= o.status < 500, (o.label, o.error)
    assert m["dllm:kv_cache_usage_perc"] == 0 and m["dllm:num_requests_running"] == 0


@pytest.mark.timeout(OVERLOAD_S + 240)
def test_overload_at_10x_capacity(soaked, figures):
    s, base, cap, _ = soaked
    # At least 10x: the search's answer moves with the machine's load of the moment (4.2 req/s in one
    # run whose server then served 40), the burst's throughput bounds it from the other side.
    rate = 10 * max(cap["capacity_req_s"], cap["burst_req_s"])
    # Long enough for the excess arrivals (9x capacity) to fill the queue twice over, even where
    # this moment's capacity is low.
    duration = OVERLOAD_S if LONG else max(OVERLOAD_S, 2 * QUEUE_CAP / (0.9 * rate))
    probe_body = {**PROBE, "max_tokens": 32, "ignore_eos": True}
    with MemorySampler(s.pid, every_s=0.5) as mem, Probe(s.url, probe_body) as probe:
        t0 = time.monotonic()
        outcomes = asyncio.run(overload_traffic(s.url, rate, duration))
        arrivals_end = t0 + duration
        drained = time.monotonic() - arrivals_end
        time.sleep(2)
    # Recovered: the first probe request sent after the arrivals ended that is served within 2x
    # its unloaded latency; the seconds from the arrivals' end to its answer.
    normal = [t + lat for t, lat, st in probe.samples if t >= arrivals_end and st == 200 and lat <= 2 * base]
    recovered = round(min(normal) - arrivals_end, 2) if normal else None
    refused = [o for o in outcomes if o.status == 503]
    admitted = [o for o in outcomes if o.status == 200]
    before, peak = mem.samples[0][1], max(x[1] for x in mem.samples)
    figures("overload", rate_req_s=round(rate, 1), duration_s=round(duration, 1), requests=len(outcomes),
            outcomes=tally(outcomes), admitted=len(admitted), refused_503=len(refused), queue_cap=QUEUE_CAP,
            client_errors=errors(outcomes), front_rss_mb_before=round(before, 1), front_rss_mb_peak=round(peak, 1),
            last_reply_s_after_arrivals_end=round(drained, 2), recovered_s_after_arrivals_end=recovered,
            probe_during_overload=ms([lat for t, lat, _ in probe.samples if t0 <= t < arrivals_end]))
    assert refused, "10x capacity never reached the queue cap"
    assert {o.status for o in outcomes} <= {200, 503}, (tally(outcomes), errors(outcomes))
    assert all(o.retry_after and int(o.retry_after) > 0 for o in refused)
    assert all(o.finish in ("stop", "length") and not o.error for o in admitted), tally(outcomes)
    assert recovered is not None and recovered < 20
    assert peak < before + 200
    assert quiet(s.url, 30)


def tracebacks(server) -> int:
    """Tracebacks in the server's log so far."""
    with open(server.log_path, errors="replace") as f:
        return sum(line.startswith("Traceback") for line in f)
