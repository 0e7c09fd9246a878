"""Capacity search on synthetic measure functions with a known capacity."""
from __future__ import annotations

import asyncio

import pytest

from loadgen.capacity import find_capacity, find_capacity_sync


def queue_measure(saturation: float):
    """p99 latency of a toy queue: 50 ms + 1000 ms * rho / (1 - rho), infinite past saturation."""
    calls = []

    def measure(rate: float) -> dict:
        calls.append(rate)
        rho = rate / saturation
        p99 = float("inf") if rho >= 1 else 50.0 + 1000.0 * rho / (1.0 - rho)
        return {"rate": rate, "p99_ms": p99}

    return measure, calls


def slo_500ms(result: dict) -> bool:
    return result["p99_ms"] <= 500.0


@pytest.mark.parametrize("saturation,start",
                         [(20.0, 1.0), (20.0, 100.0), (3.3, 0.25), (731.0, 2.0)])
def test_sync_search_finds_known_capacity(saturation, start):
    measure, calls = queue_measure(saturation)
    capacity = 450.0 * saturation / 1450.0     # where 1000*rho/(1-rho) == 450
    out = find_capacity_sync(measure, slo_500ms, start_rate=start)
    assert out["bracketed"] and out["converged"]
    assert out["capacity"] <= capacity < out["upper"]
    assert abs(out["capacity"] - capacity) / capacity <= 0.025
    assert (out["upper"] - out["lower"]) / out["lower"] <= 0.025
    assert [h["rate"] for h in out["history"]] == calls
    assert len(calls) < 20


async def test_async_measure_and_step_function():
    capacity = 13.7

    async def measure(rate: float) -> dict:
        await asyncio.sleep(0)
        return {"ok": rate <= capacity}

    out = await find_capacity(measure, lambda r: r["ok"], start_rate=1.0)
    assert out["capacity"] <= capacity and (capacity - out["capacity"]) / capacity <= 0.025
    # rates: 1, 2, 4, 8, 16 (first failure), then bisection of [8, 16]
    assert [h["rate"] for h in out["history"]][:5] == [1.0, 2.0, 4.0, 8.0, 16.0]


async def test_async_search_accepts_plain_dict_measure():
    out = await find_capacity(lambda rate: {"ok": rate <= 5.0}, lambda r: r["ok"], start_rate=1.0)
    assert 5.0 * 0.975 <= out["capacity"] <= 5.0


def test_unbracketed_outcomes():
    never_fails = find_capacity_sync(lambda r: {}, lambda _: True, start_rate=1.0, max_rate=10.0)
    assert never_fails["capacity"] == 10.0 and never_fails["upper"] is None
    assert not never_fails["bracketed"]
    always_fails = find_capacity_sync(lambda r: {}, lambda _: False, start_rate=8.0, min_rate=1.0)
    assert always_fails["capacity"] is None and always_fails["upper"] == 1.0
    assert [h["rate"] for h in always_fails["history"]] == [8.0, 4.0, 2.0, 1.0]


def test_tolerance_and_sync_rejects_coroutines():
    out = find_capacity_sync(lambda r: {"ok": r <= 100.0}, lambda x: x["ok"], start_rate=1.0,
                             tolerance=0.001)
    assert 99.9 <= out["capacity"] <= 100.0

    async def measure(rate):
        return {}

    with pytest.raises(TypeError):
        find_capacity_sync(measure, lambda _: True)
