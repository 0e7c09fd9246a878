"""The simulator's cost-model protocol, and FittedCost: this machine's step-time regression fitted to a real
engine's iteration reports by sim/calibrate.py (GPU models: gpu.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from .step_time import CACHE_COLUMNS, RECOMPUTE_COLUMNS, features, fit


class CostModel(Protocol):
    """Seconds for an IterationStats: forward_s the model forward, turn_s the whole worker turn around it."""
    name: str
    message_latency_s: float
    idle_turn_s: float
    num_layers: int

    def forward_s(self, it) -> float: ...

    def turn_s(self, it) -> float: ...

    def kv_bytes(self, tokens: int) -> int: ...

    def kv_transfer_s(self, num_bytes: int) -> float: ...

    def describe(self) -> dict: ...


def iteration_features(it) -> np.ndarray:
    return features(it.decode_tokens, it.decode_keys, it.prefill_tokens, it.prefill_sq)


def trimmed_fit(x: np.ndarray, y: np.ndarray, rounds: int = 3, k: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """step_time.fit without samples more than k robust sigmas ABOVE the fit: a reported turn time includes the
    wait on an idle inbox, which is no work. Returns (coef, kept)."""
    keep = np.ones(len(y), dtype=bool)
    coef = fit(x, y)
    for _ in range(rounds):
        resid = y - x @ coef
        sigma = 1.4826 * np.median(np.abs(resid[keep] - np.median(resid[keep]))) + 1e-9
        new = resid <= np.median(resid[keep]) + k * sigma
        if new.sum() < 2 or (new == keep).all():
            break
        keep = new
        coef = fit(x[keep], y[keep])
    return coef, keep


def fit_iterations(rows: list[tuple[float, float, float, float, float, float]]) -> dict:
    """rows: (decode_tokens, decode_keys, prefill_tokens, prefill_sq, turn_s, forward_s). Per kind ("cache",
    "recompute"): turn and forward coefficients, samples, turn samples left out as waits, turn error."""
    out = {}
    n = len(CACHE_COLUMNS)
    for kind, columns in (("cache", CACHE_COLUMNS), ("recompute", RECOMPUTE_COLUMNS)):
        sel = [r for r in rows if (r[2] > 0) == (kind == "recompute") and r[4] > 0]
        if len(sel) < 2:
            continue
        x = np.stack([features(*r[:4]) for r in sel])
        turn, fwd = np.asarray([r[4] for r in sel]), np.asarray([r[5] for r in sel])
        base = out.get("cache")
        if kind == "recompute" and base is not None:
            bt, bf = np.asarray(base["turn"]), np.asarray(base["forward"])
            ct, kept = trimmed_fit(x[:, n:], turn - x[:, :n] @ bt)
            ct = np.concatenate([bt, ct])
            cf = np.concatenate([bf, fit(x[:, n:], fwd - x[:, :n] @ bf)])
        else:
            ct, kept = trimmed_fit(x, turn)
            cf = fit(x, fwd)
        err = np.abs(x[kept] @ ct - turn[kept]) / turn[kept]
        out[kind] = {"columns": list(columns), "turn": ct.tolist(), "forward": cf.tolist(), "samples": len(sel),
                     "turn_left_out": int((~kept).sum()), "turn_mean_abs_rel_error": float(err.mean())}
    return out


@dataclass
class FittedCost:
    """Iteration times fitted per kind; a missing recompute kind falls back to the cache kind."""
    fits: dict
    message_latency_s: float
    idle_turn_s: float
    kv_bytes_per_token: int
    link_bytes_per_s: float
    num_layers: int
    name: str = "cpu-fitted"
    meta: dict = field(default_factory=dict)

    def _coef(self, recompute: bool, which: str) -> tuple[np.ndarray, int]:
        kind = self.fits.get("recompute" if recompute else "cache") or self.fits["cache"]
        coef = np.asarray(kind[which])
        return coef, len(coef)

    def _predict(self, it, which: str) -> float:
        x = iteration_features(it)
        coef, n = self._coef(it.prefill_tokens > 0, which)
        return float(x[:n] @ coef)

    def forward_s(self, it) -> float:
        return self._predict(it, "forward")

    def turn_s(self, it) -> float:
        return max(self._predict(it, "turn"), self.forward_s(it))

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.kv_bytes_per_token

    def kv_transfer_s(self, num_bytes: int) -> float:
        return num_bytes / self.link_bytes_per_s

    def describe(self) -> dict:
        return {"cost_model": self.name, "message_latency_ms": 1e3 * self.message_latency_s,
                "idle_turn_ms": 1e3 * self.idle_turn_s, "link_GB_per_s": self.link_bytes_per_s / 1e9,
                "fits": {k: {"samples": v["samples"], "turn_mean_abs_rel_error": v["turn_mean_abs_rel_error"]}
                         for k, v in self.fits.items()}, **self.meta}

    def to_json(self) -> dict:
        return {"kind": self.name, "fits": self.fits, "message_latency_s": self.message_latency_s,
                "idle_turn_s": self.idle_turn_s, "kv_bytes_per_token": self.kv_bytes_per_token,
                "link_bytes_per_s": self.link_bytes_per_s, "num_layers": self.num_layers, "meta": self.meta}


def load_cpu_cost(path: str | Path, num_workers: int = 1) -> FittedCost:
    """The calibration's fit for `num_workers` concurrent workers (they slow each other), or the nearest."""
    data = json.loads(Path(path).read_text())
    by_workers = data["by_workers"]
    key = min(by_workers, key=lambda k: (abs(int(k) - num_workers), int(k)))
    d = by_workers[key]
    meta = {**data.get("meta", {}), "fitted_with_workers": int(key), "calibration": str(path)}
    return FittedCost(d["fits"], data["message_latency_s"], data["idle_turn_s"], data["kv_bytes_per_token"],
                      data["link_bytes_per_s"], data["num_layers"], meta=meta)
