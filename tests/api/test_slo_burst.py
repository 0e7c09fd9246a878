"""A simultaneous burst against the slo policy (issue 33), of the benchmark's shape
(bench/slo_burst.py): the requests arrive at once, first each naming the fixed default 0.9, then
the same requests with an SLO set to the latency the fixed run met for 30 % of them. The policy
must meet at least as many SLOs as the fixed threshold it replaces, and gives a threshold above
the default to no request that shares its worker (in a burst: none but the one that found the
server idle). On the embedded
demo model (v3: its task answers take one to a few forwards, its chat answers a forward a position).

And where the threshold decides the burst (demo v2, kept in the tree: its answers take about 37
forwards at 0.9 and 31 at 0.5), the policy must gain the issue's 30 points over fixed 0.9.

(Not on a tiny random checkpoint: its blocks end in one or two forwards at low thresholds, so a
burst there is bound by the lease round trip at every block boundary, and a lower threshold made
it slower, 0.585 s against 0.475 s at fixed 0.5 vs 0.9 for 21 % fewer forwards; see docs/slo.md.)"""
import asyncio
from pathlib import Path

import numpy as np

from bench.slo_burst import burst, burst_requests, summarise

from .conftest import start_server


ROUNDS = 3
V2 = Path(__file__).resolve().parents[2] / "training" / "demo-v2" / "model"


def _round(url: str, reqs: list[dict]) -> tuple[float, list[dict], list[dict]]:
    """Fixed 0.9, then the slo policy with the SLO fixed 0.9 met for 30 % of the requests."""
    fixed = asyncio.run(burst(url, reqs, {"threshold": 0.9}))
    slo_s = float(np.quantile([o["latency_s"] for o in fixed], 0.3))
    return slo_s, fixed, asyncio.run(burst(url, reqs, {"slo_ms": 1e3 * slo_s}))


def test_a_burst_meets_at_least_as_many_slos_as_fixed_0_9(tmp_path):
    s = start_server(None, "--threshold-policy", "slo", tmp_path=tmp_path)
    try:
        reqs = burst_requests(24)
        asyncio.run(burst(s.url, reqs[:3], {"threshold": 0.9}))                    # warm-up
        rounds = [_round(s.url, reqs) for _ in range(ROUNDS)]
    finally:
        s.stop()
    met_fixed = met_policy = 0
    for slo_s, fixed, policy in rounds:
        f, p, p_slack = summarise(fixed, slo_s), summarise(policy, slo_s), summarise(policy, 1.1 * slo_s)
        print(f"SLO {slo_s:.2f} s; fixed 0.9 {f}; slo policy {p}; policy within 1.1 x SLO {p_slack['attainment']:.3f}")
        met_fixed += f["attainment"] * len(fixed)
        met_policy += p_slack["attainment"] * len(policy)
    # On v3 a task answer takes one or two forwards, so the burst's latencies come in waves (one
    # iteration of about ten prefills each) and the 30 % SLO falls on a wave's end: the same wave
    # a few milliseconds later meets none of it, and which requests open a worker's first
    # iteration shifts every wave by up to 0.1 s from one burst to the next (either way, either
    # config). So the policy is held to fixed 0.9's attainment over three rounds together, with
    # 10 % of each round's SLO for wave timing (bench/slo_burst.py reports the exact SLO, docs/slo.md).
    n = sum(len(policy) for _, _, policy in rounds)
    assert met_policy >= met_fixed - 0.05 * n, (met_fixed, met_policy, n)
    # Above the default only for a request alone on its worker with slack to spare: in a burst at
    # most the one that found the server idle (the rule itself: tests/policy/test_slo_policy.py)
    raised = [o for _, _, policy in rounds for o in policy if max(o["thresholds"]) > 0.9]
    assert len(raised) <= ROUNDS, [(o["thresholds"], o["latency_s"]) for o in raised]


def test_where_the_threshold_decides_a_burst_the_policy_gains_30_points(tmp_path):
    """Demo v2: every answer costs tens of forwards, so lowering the threshold shortens every one
    and the burst drains sooner (bench/slo_burst.py --model training/demo-v2/model: +70 and +48
    points with 40 requests, docs/slo.md). One round of 16 requests; the issue's goal, no slack."""
    s = start_server(str(V2), "--threshold-policy", "slo", tmp_path=tmp_path)
    try:
        reqs = burst_requests(16)
        asyncio.run(burst(s.url, reqs[:3], {"threshold": 0.9}))                    # warm-up
        slo_s, fixed, policy = _round(s.url, reqs)
    finally:
        s.stop()
    f, p = summarise(fixed, slo_s), summarise(policy, slo_s)
    print(f"SLO {slo_s:.2f} s; fixed 0.9 {f}; slo policy {p}")
    assert p["attainment"] >= f["attainment"] + 0.30, (f, p)
    assert p["forwards_per_answer"] < f["forwards_per_answer"], (f, p)      # it got there by the threshold
