"""Numeric bounds as regular expressions (structured/numbers.py), checked against the integers and decimals
themselves: exhaustively over a window around each bound."""
import random
import re

import pytest

from dllm_server.structured.numbers import integer_regex, number_regex

RANGES = [(0, 0), (1, 12), (0, None), (-5, 5), (None, 3), (-100, -7), (7, 1234), (None, None), (-1, None),
          (13, 13), (95, 1005), (None, -3), (1000, 65535)]


@pytest.mark.parametrize("lo,hi", RANGES)
def test_integer_regex_matches_exactly_the_range(lo, hi):
    r = re.compile(integer_regex(lo, hi))
    for v in range(-2100, 2100):
        assert bool(r.fullmatch(str(v))) == ((lo is None or v >= lo) and (hi is None or v <= hi)), v
    for v in (lo, hi):
        if v is not None:
            assert r.fullmatch(str(v))
    for s in ("01", "-0", "00", "+1", "1.0", "", "-"):
        assert not r.fullmatch(s), s


@pytest.mark.parametrize("lo,hi", [(0, 1), (-1, 1), (0, None), (None, 0), (-10, -2), (3, 250), (-90, 60)])
def test_number_regex_matches_exactly_the_range(lo, hi):
    r = re.compile(number_regex(lo, hi))
    rng = random.Random(0)
    inside = lambda s: (lo is None or float(s) >= lo) and (hi is None or float(s) <= hi)   # noqa: E731
    for _ in range(20000):
        ip, digits = rng.randint(-300, 300), rng.choice([0, 1, 2, 3])
        s = str(ip) if digits == 0 else f"{ip}.{rng.randrange(10 ** digits):0{digits}d}"
        if s.startswith("-0") and float(s) == 0:
            continue
        assert bool(r.fullmatch(s)) == inside(s), s
    for b in (lo, hi):
        if b is not None:
            assert r.fullmatch(str(b)) and r.fullmatch(f"{b}.00")
    for s in ("1e3", "01", ".5", "1.", "+1"):
        assert not r.fullmatch(s), s


def test_an_empty_range_is_refused():
    with pytest.raises(ValueError, match="above"):
        integer_regex(5, 4)
