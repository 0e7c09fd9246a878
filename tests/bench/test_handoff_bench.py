"""bench/handoff.py keeps working: both transfer modes run the same workload and report handoffs."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_handoff_bench_runs_both_modes(tiny_llada):
    proc = subprocess.run([sys.executable, "-m", "bench.handoff", "--model", tiny_llada,
                           "--requests", "4", "--rate", "8", "--rounds", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| after_prefill")
            or line.startswith("| layerwise")]
    assert [r[1].strip() for r in rows] == ["after_prefill", "layerwise"]
    for r in rows:
        handoffs, stall, failed = int(r[2]), float(r[3]), int(r[5])
        assert handoffs > 0 and stall > 0 and failed == 0
