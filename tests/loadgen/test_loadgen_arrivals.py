"""Arrival processes: goodness of fit (hand-computed Kolmogorov-Smirnov), gamma burstiness,
offsets and trace parsing."""
from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.arrivals import (arrival_offsets, constant_gaps, gamma_gaps, offsets_from_gaps,
                              parse_trace_lines, poisson_gaps, trace_offsets)


def ks_exponential(x: np.ndarray, rate: float) -> tuple[float, float]:
    """One-sample KS statistic D against Exponential(rate) and its asymptotic p-value
    (Kolmogorov distribution with Stephens' small-sample correction)."""
    x = np.sort(x)
    n = x.size
    cdf = 1.0 - np.exp(-rate * x)
    i = np.arange(1, n + 1)
    d = max(np.max(i / n - cdf), np.max(cdf - (i - 1) / n))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2.0 * sum((-1) ** (k - 1) * math.exp(-2.0 * k * k * lam * lam) for k in range(1, 101))
    return float(d), min(1.0, max(0.0, p))


@pytest.mark.parametrize("seed,rate", [(0, 3.0), (7, 0.5), (12345, 40.0)])
def test_poisson_gaps_are_exponential(seed, rate):
    gaps = poisson_gaps(rate, 5000, np.random.default_rng(seed))
    d, p = ks_exponential(gaps, rate)
    assert p > 0.01, (d, p)
    assert d < 1.36 / math.sqrt(gaps.size)          # 5 % critical value
    # not truncated: the tail is there (max of 5000 Exp gaps is ~ ln(5000)/rate ~ 8.5 means)
    assert gaps.max() > 5.0 / rate


def test_ks_has_power():
    """The same check rejects gaps that are not exponential with the same mean."""
    rng = np.random.default_rng(1)
    assert ks_exponential(constant_gaps(3.0, 5000), 3.0)[1] < 1e-6
    assert ks_exponential(gamma_gaps(3.0, 4.0, 5000, rng), 3.0)[1] < 1e-6
    assert ks_exponential(rng.uniform(0, 2 / 3.0, 5000), 3.0)[1] < 1e-6


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_mean_and_cv(burstiness):
    rate = 5.0
    gaps = gamma_gaps(rate, burstiness, 40000, np.random.default_rng(3))
    assert gaps.mean() == pytest.approx(1.0 / rate, rel=0.03)
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1.0 / math.sqrt(burstiness), rel=0.05)


def test_gamma_burstiness_one_is_poisson():
    gaps = gamma_gaps(2.0, 1.0, 5000, np.random.default_rng(11))
    assert ks_exponential(gaps, 2.0)[1] > 0.01


def test_offsets_and_seeding():
    a = arrival_offsets("poisson", 4.0, 50, np.random.default_rng(5))
    b = arrival_offsets("poisson", 4.0, 50, np.random.default_rng(5))
    assert np.array_equal(a, b) and a[0] == 0.0 and np.all(np.diff(a) >= 0) and a.size == 50
    assert np.allclose(arrival_offsets("constant", 2.0, 4, None), [0, 0.5, 1.0, 1.5])
    assert np.all(arrival_offsets("gamma", math.inf, 5, np.random.default_rng(0), 0.5) == 0)
    assert offsets_from_gaps(np.array([9.0, 1.0, 2.0])).tolist() == [0.0, 1.0, 3.0]
    with pytest.raises(ValueError):
        arrival_offsets("weibull", 1.0, 3, np.random.default_rng(0))
    with pytest.raises(ValueError):
        poisson_gaps(0.0, 3, np.random.default_rng(0))
    with pytest.raises(ValueError):
        gamma_gaps(1.0, 0.0, 3, np.random.default_rng(0))


def test_trace_parsing():
    lines = ['# comment', '{"timestamp": 12.5, "prompt_len": 10, "output_len": 4}', '',
             '{"timestamp": 10.0, "prompt": "hi there", "output_len": 2}']
    entries = parse_trace_lines(lines)
    assert [e.timestamp for e in entries] == [10.0, 12.5]
    assert entries[0].prompt == "hi there" and entries[1].prompt_len == 10
    assert trace_offsets(entries).tolist() == [0.0, 2.5]
    assert trace_offsets(entries, speed=2.0).tolist() == [0.0, 1.25]
    with pytest.raises(ValueError):
        parse_trace_lines(['{"timestamp": 1, "output_len": 3}'])
