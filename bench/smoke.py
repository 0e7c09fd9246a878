"""`make bench-smoke`: the whole benchmark pipeline on a short run (well under 5 minutes), so it
keeps working: a tiny model, a real server, a load-generator rate sweep with plots, a capacity
search, and the offline decoding table.

    python bench/smoke.py [--out runs/bench-smoke]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from dllm_server.server_process import serve
from dllm_server.model.tiny import make_tiny_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench-smoke")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(out / "tiny-llada", arch="llada", seed=0)
    t0 = time.monotonic()
    server = serve(model, "--block-length", "8", log_path=out / "server.log")
    url = server.url
    try:
        common = [sys.executable, "-m", "loadgen", "--base-url", url, "--dataset", "random", "--vocab-size", "250",
                  "--id-low", "1", "--prompt-len", "32", "--output-len", "16", "--ignore-eos", "--seed", "0",
                  "--result-dir", str(out)]
        subprocess.run(common + ["--rates", "2,4", "--num-prompts", "12", "--label", "sweep",
                                 "--goodput", "e2el:5000"], check=True)
        subprocess.run(common + ["--capacity-search", "--goodput", "e2el:3000", "--capacity-target", "0.9",
                                 "--capacity-start-rate", "2", "--capacity-max-rate", "32", "--num-prompts", "10",
                                 "--label", "capacity"],
                       check=True)
        subprocess.run([sys.executable, "bench/decoding.py", "--model", str(model), "--prompt-len", "64",
                        "--max-tokens", "32", "--block-length", "8", "--repeats", "1"], check=True)
    finally:
        server.stop(timeout=60)
    results = sorted(p.name for p in out.glob("*.json")) + sorted(p.name for p in out.glob("*.png"))
    print(json.dumps({"seconds": round(time.monotonic() - t0, 1), "files": results}))
    return 0



if __name__ == "__main__":
    sys.exit(main())
