"""`make bench-smoke`: the benchmark pipeline on a short run (well under 5 minutes), so it keeps working: a
tiny model, a real server, a load-generator rate sweep with plots, a capacity search, the decoding table.

    python -m bench.smoke [--out runs/bench-smoke]
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.harness import Timer, parser, server
from dllm_server.model.tiny import make_tiny_model

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", default="runs/bench-smoke")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(out / "tiny-llada", arch="llada", seed=0)
    with Timer() as t, server(model, "--block-length", "8", log_path=out / "server.log") as s:
        url = s.url
        common = [sys.executable, "-m", "loadgen", "--base-url", url, "--dataset", "random", "--vocab-size", "250",
                  "--id-low", "1", "--prompt-len", "32", "--output-len", "16", "--ignore-eos", "--seed", "0",
                  "--result-dir", str(out)]
        subprocess.run(common + ["--rates", "2,4", "--num-prompts", "12", "--label", "sweep",
                                 "--goodput", "e2el:5000"], check=True)
        subprocess.run(common + ["--capacity-search", "--goodput", "e2el:3000", "--capacity-target", "0.9",
                                 "--capacity-start-rate", "2", "--capacity-max-rate", "32", "--num-prompts", "10",
                                 "--label", "capacity"],
                       check=True)
        subprocess.run([sys.executable, "-m", "bench.decoding", "--model", str(model.resolve()), "--prompt-len", "64",
                        "--max-tokens", "32", "--block-length", "8", "--repeats", "1"], check=True, cwd=ROOT)
    results = sorted(p.name for p in out.glob("*.json")) + sorted(p.name for p in out.glob("*.png"))
    print(json.dumps({"seconds": round(t.s, 1), "files": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
