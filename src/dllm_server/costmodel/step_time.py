"""A worker's iteration time c0 + c1 decode_tokens + c2 decode_keys [+ c3 prefill_tokens + c4 prefill_sq], fitted
per kind: cache steps, and recompute steps (a full-canvas forward), which are rarer, so they fit only their prefill
terms and take their decode part from the cache fit."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from ..messages import LoadReport

CACHE_COLUMNS = ("const", "decode_tokens", "decode_keys_k")
RECOMPUTE_COLUMNS = CACHE_COLUMNS + ("prefill_tokens", "prefill_sq_m")


def features(decode_tokens: float, decode_keys: float, prefill_tokens: float = 0.0, prefill_sq: float = 0.0,
             recompute: bool | None = None) -> np.ndarray:
    """One iteration's regressors (keys in thousands, squares in millions: similar magnitudes)."""
    recompute = prefill_tokens > 0 if recompute is None else recompute
    row = [1.0, decode_tokens, decode_keys / 1e3]
    if recompute:
        row += [prefill_tokens, prefill_sq / 1e6]
    return np.asarray(row, dtype=np.float64)


def report_features(r: LoadReport) -> np.ndarray:
    decode_tokens = r.iteration_tokens - r.prefill_tokens
    return features(decode_tokens, r.decode_keys, r.prefill_tokens, r.prefill_sq)


def fit(x: np.ndarray, y: np.ndarray, ridge: float = 1e-6) -> np.ndarray:
    """Non-negative least squares (time never falls with more work); the ridge covers columns a profile never varies."""
    k = x.shape[1]
    active = list(range(k))
    coef = np.zeros(k)
    while active:
        a = np.vstack([x[:, active], np.sqrt(ridge) * np.eye(len(active))])
        b = np.concatenate([y, np.zeros(len(active))])
        sol, *_ = np.linalg.lstsq(a, b, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


@dataclass(slots=True)
class _Kind:
    columns: tuple[str, ...]
    samples: collections.deque = field(default_factory=lambda: collections.deque(maxlen=512))
    coef: np.ndarray | None = None
    since_fit: int = 0


class StepTimeModel:
    def __init__(self, max_samples: int = 512, refit_every: int = 16):
        self.kinds = {False: _Kind(CACHE_COLUMNS), True: _Kind(RECOMPUTE_COLUMNS)}
        for k in self.kinds.values():
            k.samples = collections.deque(maxlen=max_samples)
        self.refit_every = refit_every
        self.abs_rel_error = collections.deque(maxlen=256)   # |predicted - measured| / measured, before learning it

    def add(self, x: np.ndarray, seconds: float) -> None:
        if not seconds > 0:
            return
        kind = self.kinds[len(x) == len(RECOMPUTE_COLUMNS)]
        if kind.coef is not None:
            self.abs_rel_error.append(abs(float(x @ kind.coef) - seconds) / seconds)
        kind.samples.append((x, seconds))
        kind.since_fit += 1
        if kind.coef is None or kind.since_fit >= self.refit_every:
            self._refit(kind)

    def add_report(self, r: LoadReport) -> None:
        self.add(report_features(r), r.iteration_s)

    def _refit(self, kind: _Kind) -> None:
        kind.since_fit = 0
        if len(kind.samples) < 2:
            return
        x = np.stack([s[0] for s in kind.samples])
        y = np.asarray([s[1] for s in kind.samples])
        cache = self.kinds[False].coef
        n = len(CACHE_COLUMNS)
        if kind is self.kinds[True] and cache is not None:   # the prefill part of what the decodes leave
            kind.coef = np.concatenate([cache, fit(x[:, n:], y - x[:, :n] @ cache)])
        else:
            kind.coef = fit(x, y)
        if kind is self.kinds[False] and self.kinds[True].samples:
            self._refit(self.kinds[True])                    # its decode part just changed

    @property
    def ready(self) -> bool:
        return self.kinds[False].coef is not None

    def predict(self, x: np.ndarray) -> float:
        kind = self.kinds[len(x) == len(RECOMPUTE_COLUMNS)]
        coef = kind.coef
        if coef is None:                          # no recompute samples yet: the cache part alone
            coef = self.kinds[False].coef
            x = x[: len(CACHE_COLUMNS)]
        return float(x @ coef) if coef is not None else 0.0

    def mean_abs_rel_error(self) -> float | None:
        return float(np.mean(self.abs_rel_error)) if self.abs_rel_error else None
