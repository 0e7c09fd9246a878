"""The step predictor's cost on the front loop: seconds per call and per row of the shipped artefact and
of the simple estimator, at the SLO policy's batch shapes (6 candidates x 1, 16, 64 requests).

    python -m bench.predictor_cost [--predictor src/dllm_server/assets/demo-model/step_predictor.json] [--json out.json]
"""
from __future__ import annotations

import numpy as np

from bench.harness import Report, Timer, parser
from dllm_server.checkpoint import embedded_model_path
from dllm_server.policy.predictor import SimpleEstimator, TreePredictor
from dllm_server.policy.progress import FEATURES

CANDIDATES = 6


def per_call_s(fn, x: np.ndarray, min_s: float = 0.5) -> float:
    """Calls for at least `min_s`, their mean. Rows are uniform in [0, 64): tree depth is fixed, so
    the cost hardly depends on the values."""
    fn(x)
    n = 0
    with Timer() as t:
        while t.s < min_s:
            fn(x)
            n += 1
    return t.s / n


def main() -> None:
    ap = parser(__doc__, json_out=True)
    ap.add_argument("--predictor", default=str(embedded_model_path() / "step_predictor.json"))
    ap.add_argument("--requests", type=lambda t: [int(x) for x in t.split(",")], default=[1, 16, 64])
    a = ap.parse_args()
    trees = TreePredictor.load(a.predictor)
    simple = SimpleEstimator()
    rng = np.random.default_rng(0)
    print(f"{a.predictor}: {sum(len(m.value) for m in trees.models.values())} tree nodes over "
          f"{len(trees.models)} targets\n")
    report = Report(a.json)
    table = report.table(["predictor", "requests", "rows (x 6 candidates)", ("µs per call", ".0f"),
                          ("µs per row", ".1f")])
    for name, p in (("gradient-boosted trees", trees), ("simple estimator", simple)):
        for n in a.requests:
            x = rng.uniform(0, 64, size=(n * CANDIDATES, len(FEATURES)))
            t = per_call_s(p.predict, x)
            table.row(name, n, n * CANDIDATES, 1e6 * t, 1e6 * t / (n * CANDIDATES))
    report.save()


if __name__ == "__main__":
    main()
