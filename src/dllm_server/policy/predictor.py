"""The step predictor: for a request in flight and a candidate threshold, the forwards its current
block still needs (`block_rem`), the forwards of the blocks after it (`fut_forwards`) and how many
blocks that is (`fut_blocks`, each one a re-prefill).

Two implementations of one interface (`predict(X) -> {target: array}` over rows of
progress.FEATURES):
- `TreePredictor`: gradient-boosted trees trained offline by scripts/train_step_predictor.py
  (scikit-learn's HistGradientBoostingRegressor) and exported to a small JSON artefact, evaluated
  here with numpy alone, so serving needs neither scikit-learn nor a pickle of its version.
- `SimpleEstimator`: the documented fallback for a checkpoint without an artefact (see its
  docstring); no training, pessimistic about the answer's length.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .progress import FEATURES

ARTEFACT = "step_predictor.json"


class TreeEnsemble:
    """Sum of regression trees plus a baseline. Nodes of all trees are packed into [T, N] arrays and
    evaluated level by level for every row at once (a few numpy operations per tree level)."""

    def __init__(self, baseline: float, trees: list[dict]):
        self.baseline = float(baseline)
        n = max(len(t["value"]) for t in trees) if trees else 1
        t_count = max(1, len(trees))

        def pack(key, fill, dtype):
            a = np.full((t_count, n), fill, dtype=dtype)
            for i, t in enumerate(trees):
                a[i, : len(t[key])] = t[key]
            return a
        self.feature = pack("feature", 0, np.int64)
        self.threshold = pack("threshold", 0.0, np.float64)
        self.left = pack("left", 0, np.int64)
        self.right = pack("right", 0, np.int64)
        self.missing_left = pack("missing_left", 1, bool)
        self.leaf = pack("leaf", True, bool)
        self.value = pack("value", 0.0, np.float64)
        self.depth = max((t["depth"] for t in trees), default=0)

    @classmethod
    def from_dict(cls, d: dict) -> "TreeEnsemble":
        return cls(d["baseline"], d["trees"])

    def predict(self, x: np.ndarray) -> np.ndarray:
        rows = x.shape[0]
        t_idx = np.arange(self.feature.shape[0])[:, None]
        node = np.zeros((self.feature.shape[0], rows), dtype=np.int64)
        r_idx = np.arange(rows)[None, :]
        for _ in range(self.depth):
            f = self.feature[t_idx, node]
            v = x[r_idx, f]
            go_left = np.where(np.isnan(v), self.missing_left[t_idx, node], v <= self.threshold[t_idx, node])
            nxt = np.where(go_left, self.left[t_idx, node], self.right[t_idx, node])
            node = np.where(self.leaf[t_idx, node], node, nxt)
        return self.baseline + self.value[t_idx, node].sum(axis=0)


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

    def predict(self, x: np.ndarray) -> dict[str, np.ndarray]:
        # remaining work is never negative; a block with masks needs a forward
        out = {k: np.maximum(0.0, m.predict(x)) for k, m in self.models.items()}
        masked = x[:, FEATURES.index("masked_in_block")]
        out["block_rem"] = np.where(masked > 0, np.maximum(1.0, out["block_rem"]), 0.0)
        return out


class SimpleEstimator:
    """The fallback without a trained artefact:
    - current block: its own finished blocks' mean forwards scaled by the share still masked, or
      before any block has finished, masked positions / max(1, positions that clear tau now);
    - later blocks: none once a stop token is committed, else every block up to max_tokens (it
      cannot foresee where the answer ends, so it is pessimistic: lower thresholds under an SLO),
      each costing the mean of the finished blocks, or half a block's positions before that."""
    name = "simple"
    meta: dict = {}

    def predict(self, x: np.ndarray) -> dict[str, np.ndarray]:
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
    """A fitted sklearn HistGradientBoostingRegressor as a TreeEnsemble dict (numeric features,
    squared-error loss). Reads the fitted predictors' node arrays."""
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
