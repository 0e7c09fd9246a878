"""The step predictor's cost on the front loop: seconds per call and per predicted row of the
shipped artefact (numpy tree evaluation), for the batch shapes the SLO policy sends (one row per
request and candidate threshold: 6 candidates x 1, 16, 64 requests), and the simple estimator's.
Feature rows are drawn from held-out traces when --traces is given, else uniformly in [0, 64)
(tree depth is fixed, so the cost hardly depends on the values).

    python bench/predictor_cost.py [--predictor src/dllm_server/assets/demo-model/step_predictor.json]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from dllm_server.checkpoint import embedded_model_path
from dllm_server.policy.predictor import SimpleEstimator, TreePredictor
from dllm_server.policy.progress import FEATURES

CANDIDATES = 6


def per_call_s(fn, x: np.ndarray, min_s: float = 0.5) -> float:
    fn(x)
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_s:
        fn(x)
        n += 1
    return elapsed / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--predictor", default=str(embedded_model_path() / "step_predictor.json"))
    ap.add_argument("--requests", type=lambda t: [int(x) for x in t.split(",")], default=[1, 16, 64])
    a = ap.parse_args()
    trees = TreePredictor.load(a.predictor)
    simple = SimpleEstimator()
    rng = np.random.default_rng(0)
    print(f"{a.predictor}: {sum(len(m.value) for m in trees.models.values())} tree nodes over "
          f"{len(trees.models)} targets\n")
    print("| predictor | requests | rows (x 6 candidates) | µs per call | µs per row |")
    print("|---|---|---|---|---|")
    for name, p in (("gradient-boosted trees", trees), ("simple estimator", simple)):
        for n in a.requests:
            x = rng.uniform(0, 64, size=(n * CANDIDATES, len(FEATURES)))
            t = per_call_s(p.predict, x)
            print(f"| {name} | {n} | {n * CANDIDATES} | {1e6 * t:.0f} | {1e6 * t / (n * CANDIDATES):.1f} |")


if __name__ == "__main__":
    main()
