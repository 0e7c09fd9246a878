"""Regular expressions for JSON numbers within bounds (JSON Schema's minimum / maximum), which the schema
compiler leaves unconstrained. Pure string functions."""
from __future__ import annotations


def _fixed_width(lo: str, hi: str) -> list[str]:
    """Alternatives matching every digit string of len(lo) == len(hi) between lo and hi (leading zeros kept)."""
    if not lo:
        return [""]
    if lo == hi:
        return [lo]
    a, b, rest = lo[0], hi[0], len(lo) - 1
    if a == b:
        return [a + alt for alt in _fixed_width(lo[1:], hi[1:])]
    any_rest = f"[0-9]{{{rest}}}" if rest > 1 else ("[0-9]" if rest == 1 else "")
    out = []
    if lo[1:] == "0" * rest:
        first = a
    else:
        out += [a + alt for alt in _fixed_width(lo[1:], "9" * rest)]
        first = chr(ord(a) + 1)
    last = b if hi[1:] == "9" * rest else chr(ord(b) - 1)
    if first <= last:
        out.append((first if first == last else f"[{first}-{last}]") + any_rest)
    if last != b:
        out += [b + alt for alt in _fixed_width("0" * rest, hi[1:])]
    return out


def _naturals(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the integers in [lo, hi] (hi None: unbounded), lo >= 0, without leading zeros."""
    out = []
    top = len(str(hi)) if hi is not None else len(str(lo))
    for width in range(len(str(lo)), top + 1):
        a = max(lo, 10 ** (width - 1) if width > 1 else 0)
        b = 10 ** width - 1 if hi is None else min(hi, 10 ** width - 1)
        if a <= b:
            out += _fixed_width(str(a).zfill(width), str(b).zfill(width))
    if hi is None:
        out.append(f"[1-9][0-9]{{{top},}}")
    return out


def _group(alts: list[str]) -> str:
    return alts[0] if len(alts) == 1 else "(" + "|".join(alts) + ")"


def _signed(lo: int | None, hi: int | None, magnitudes, neg_floor: int) -> str:
    """[lo, hi] as the non-negative magnitudes it holds, or a minus before those of its negative part (from
    `neg_floor`: 1 for integers, which have no -0; 0 for numbers, where -0.5 is negative)."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"minimum {lo} is above maximum {hi}")
    alts = []
    if hi is None or hi >= 0:
        alts += magnitudes(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        neg = magnitudes(max(neg_floor, -hi) if hi is not None else neg_floor, None if lo is None else -lo)
        alts.append("-" + _group(neg))
    return _group(alts)


def integer_regex(lo: int | None, hi: int | None) -> str:
    """A regex matching exactly the JSON integers in [lo, hi] (None: unbounded on that side)."""
    return _signed(lo, hi, _naturals, 1)


def number_regex(lo: int | None, hi: int | None) -> str:
    """A regex for JSON numbers (no exponent) in [lo, hi], whole-number bounds: an integer part inside the
    range with any fraction, or the bound itself with a zero fraction."""
    frac, zeros = r"(\.[0-9]+)?", r"(\.0+)?"

    def magnitudes(m_lo: int, m_hi: int | None) -> list[str]:
        if m_hi is None:
            return [integer_regex(m_lo, None) + frac]
        alts = [integer_regex(m_lo, m_hi - 1) + frac] if m_lo <= m_hi - 1 else []
        return alts + [str(m_hi) + zeros]

    return _signed(lo, hi, magnitudes, 0)
