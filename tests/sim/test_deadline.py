"""Deadline-aware scheduling on the real Scheduler and WorkerCore (the simulator replaces only the forward): a mix
of tight and loose SLOs meets more of them than arrival order, and under a continuous overload of tight requests
a request without an SLO, and one with a loose SLO, are still answered within the stated bound."""
import numpy as np
import pytest

from dllm_server.config import ServerConfig
from dllm_server.costmodel.gpu import gpu_cost
from dllm_server.sim.behaviour import SimRequest
from dllm_server.sim.regroup import layout_simulator

COST = gpu_cost("llada-8b", "h100", block_length=32, tp=1)
HORIZON_S = 10.0


def run(requests, order: str):
    config = ServerConfig(block_length=32, threshold=0.9, token_budget=1024, max_waiting_requests=1 << 20,
                          scheduling_policy=order, default_deadline_s=HORIZON_S)
    return layout_simulator([1], lambda d: COST, config).run(requests)


def test_deadline_order_meets_the_tight_slos_that_arrival_order_misses():
    rng = np.random.default_rng(1)
    requests, t = [], 0.0
    while t < 20:                                      # one TP1 instance, near saturation: 5 req/s of 1024 + 256
        requests.append(SimRequest(t, 1024, 256, slo_ms=float(rng.choice([3000.0, 15000.0]))))
        t += rng.exponential(1 / 5.0)
    met = {order: [bool(r.slo_met) for r in run(requests, order).requests] for order in ("fcfs", "deadline")}
    assert np.mean(met["deadline"]) >= np.mean(met["fcfs"]) + 0.25, {k: np.mean(v) for k, v in met.items()}


def test_no_request_starves_behind_a_stream_of_tight_ones():
    """A 60-s stream at about twice what the instance serves, every request with a 4-s SLO (most will miss it);
    at t = 1 one request without an SLO and one with a 20-s SLO. The bound: due at arrival + its SLO (or +
    default_deadline_s without one), + default_deadline_s once late, + serving what was ahead of it then."""
    rng = np.random.default_rng(0)
    requests, t = [], 0.0
    while t < 60:
        requests.append(SimRequest(t, 1024, 256, slo_ms=4000.0))
        t += rng.exponential(1 / 8.0)
    requests += [SimRequest(1.0, 1024, 256), SimRequest(1.0, 1024, 256, slo_ms=20_000.0)]
    res = run(sorted(requests, key=lambda r: r.arrival_s), "deadline")
    assert res.unfinished == 0 and all(r.finish_reason == "length" for r in res.requests)
    no_slo = next(r for r in res.requests if r.slo_ms is None)
    loose = next(r for r in res.requests if r.slo_ms == 20_000.0)
    assert no_slo.latency_s <= HORIZON_S + 5.0, no_slo.latency_s
    assert loose.latency_s <= 20.0 + HORIZON_S + 15.0, loose.latency_s
    # the stream's own backlog takes far longer: waiting for it to end would have been starvation
    assert res.makespan_s > 100.0 and max(no_slo.latency_s, loose.latency_s) < 60.0


@pytest.mark.parametrize("order", ["fcfs", "deadline"])
def test_requests_without_an_slo_keep_arrival_order(order):
    requests = [SimRequest(0.05 * i, 1024, 256) for i in range(40)]
    res = run(requests, order)
    ends = [r.arrival_s + r.latency_s for r in sorted(res.requests, key=lambda r: r.seq)]
    base = [r.arrival_s + r.latency_s for r in sorted(run(requests, "fcfs").requests, key=lambda r: r.seq)]
    assert ends == base                                # no SLOs: deadline scheduling is FCFS
