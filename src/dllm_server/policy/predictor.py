"""The step predictor: per request and candidate threshold, the forwards left in the current block (`block_rem`),
of the later blocks (`fut_forwards`) and their count (`fut_blocks`, each a re-prefill). TreePredictor evaluates trees
from scripts/train_step_predictor.py with numpy alone (no scikit-learn at serving); SimpleEstimator is the fallback."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .progress import FEATURES

ARTEFACT = "step_predictor.json"


class TreeEnsemble:
    """Regression trees plus a baseline in flat node arrays (a leaf points at itself); all rows walk all trees level
    by level at once, so a batch costs about what one row does."""

    def __init__(self, baseline: float, trees: list[dict]):
        self.baseline = float(baseline)
        sizes = [len(t["value"]) for t in trees]
        self.roots = np.cumsum([0] + sizes[:-1]).astype(np.int64)
        cat = lambda key, dtype: np.concatenate([np.asarray(t[key], dtype=dtype) for t in trees]) \
            if trees else np.zeros(0, dtype)                                                      # noqa: E731
        self.feature = cat("feature", np.int64)
        self.threshold = cat("threshold", np.float64)
        self.missing_left = cat("missing_left", bool)
        self.value = cat("value", np.float64)
        leaf = cat("leaf", bool)
        own = np.arange(len(self.value))
        base = np.repeat(self.roots, sizes) if trees else own
        self.left = np.where(leaf, own, cat("left", np.int64) + base)
        self.right = np.where(leaf, own, cat("right", np.int64) + base)
        self.depth = max((t["depth"] for t in trees), default=0)

    @classmethod
    def from_dict(cls, d: dict) -> "TreeEnsemble":
        return cls(d["baseline"], d["trees"])

    def predict(self, x: np.ndarray) -> np.ndarray:
        rows, n_feat = x.shape
        if rows == 0 or len(self.roots) == 0:
            return np.full(rows, self.baseline)
        flat = np.ascontiguousarray(x, dtype=np.float64).ravel()
        row_base = (np.arange(rows) * n_feat)[None, :]
        node = np.repeat(self.roots[:, None], rows, axis=1)
        has_nan = bool(np.isnan(flat).any())
        for _ in range(self.depth):
            v = flat.take(row_base + self.feature.take(node))
            go_left = v <= self.threshold.take(node)
            if has_nan:
                go_left = np.where(np.isnan(v), self.missing_left.take(node), go_left)
            node = np.where(go_left, self.left.take(node), self.right.take(node))
        return self.baseline + self.value.take(node).sum(axis=0)


class TreePredictor:
    def __init__(self, models: dict[str, TreeEnsemble], features: tuple[str, ...], meta: dict):
        if tuple(features) != FEATURES:
            raise ValueError(f"step predictor: trained on features {features}, this server computes {FEATURES}")
        self.models, self.meta = models, meta
        self.name = "trees"

    @classmethod
    def load(cls, path: str | Path) -> "TreePredictor":
        d = json.loads(Path(path).read_text())
        return cls({k: TreeEnsemble.from_dict(v) for k, v in d["targets"].items()}, tuple(d["features"]),
                   d.get("meta", {}))

    def predict(self, x: np.ndarray, targets: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        """The named targets (all by default) for every row of x."""
        # remaining work is never negative; a block with masks needs a forward
        out = {k: np.maximum(0.0, m.predict(x)) for k, m in self.models.items() if targets is None or k in targets}
        if "block_rem" in out:
            masked = x[:, FEATURES.index("masked_in_block")]
            out["block_rem"] = np.where(masked > 0, np.maximum(1.0, out["block_rem"]), 0.0)
        return out


class SimpleEstimator:
    """Fallback without a trained artefact (docs/slo.md): every later block up to max_tokens runs until a stop
    token is committed, so it is pessimistic about length and lowers thresholds early."""
    name = "simple"
    meta: dict = {}

    def predict(self, x: np.ndarray, targets: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
        col = {n: x[:, i] for i, n in enumerate(FEATURES)}
        masked, mean_done, clear = col["masked_in_block"], col["mean_block_forwards"], col["clear_tau"]
        per_step = np.maximum(1.0, clear)
        block_rem = np.where(mean_done > 0, np.ceil(mean_done * col["masked_frac"]), np.ceil(masked / per_step))
        block_rem = np.where(masked > 0, np.maximum(1.0, block_rem), 0.0)
        fut_blocks = np.where(col["eos_seen"] > 0, 0.0, col["blocks_left"])
        per_block = np.where(mean_done > 0, mean_done, np.maximum(1.0, col["block_length"] / 2))
        return {"block_rem": block_rem, "fut_forwards": fut_blocks * per_block, "fut_blocks": fut_blocks}


def load_predictor(path: str | None, model_folder: str | Path):
    """The artefact named, else step_predictor.json next to the checkpoint, else the fallback."""
    p = Path(path) if path else Path(model_folder) / ARTEFACT
    if p.is_file():
        return TreePredictor.load(p)
    if path:
        raise ValueError(f"step_predictor: {path} does not exist")
    return SimpleEstimator()


def export_hist_gbm(model) -> dict:
    """A fitted sklearn HistGradientBoostingRegressor (numeric features, squared error) as a TreeEnsemble dict."""
    trees = []
    for (pred,) in model._predictors:
        nodes = pred.nodes
        depth = int(nodes["depth"].max()) if len(nodes) else 0
        # thresholds keep full precision (a split must not move); leaf values need far less
        trees.append({"feature": nodes["feature_idx"].tolist(), "threshold": nodes["num_threshold"].tolist(),
                      "left": nodes["left"].tolist(), "right": nodes["right"].tolist(),
                      "missing_left": nodes["missing_go_to_left"].astype(int).tolist(),
                      "leaf": nodes["is_leaf"].astype(int).tolist(),
                      "value": [float(f"{v:.6g}") for v in nodes["value"]], "depth": depth + 1})
    baseline = float(np.ravel(model._baseline_prediction)[0])
    if not math.isfinite(baseline):
        raise ValueError("model: non-finite baseline")
    return {"baseline": baseline, "trees": trees}
