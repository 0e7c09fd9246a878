"""bench/llada2.py's tables on small settings: the grouped MoE layer computes what the per-token loop computes and
touches the experts the roofline assumes; the simulated section runs both models on both GPUs."""
import json
import subprocess
import sys


def test_llada2_bench_layer_and_simulated_sections(tmp_path):
    out = tmp_path / "llada2.json"
    subprocess.run([sys.executable, "-m", "bench.llada2", "--only", "1,3", "--reps", "2", "--sim-requests", "20",
                    "--json", str(out)], check=True, capture_output=True, timeout=300)
    layer, sim = json.loads(out.read_text())["tables"]
    assert [r["tokens"] for r in layer["rows"]] == [1, 16, 64]
    assert all(r["max |grouped - loop|"] < 1e-6 for r in layer["rows"])
    touched = [r["experts touched"] for r in layer["rows"]]
    assert touched[0] == 8 and touched == sorted(touched) and touched[-1] <= 256
    rows = {(r["device"], r["model"], r["tokens/forward"]): r for r in sim["rows"]}
    assert len(rows) == 6
    for device in ("h100", "h200"):
        assert rows[(device, "llada-8b", 2.0)]["vs LLaDA-8B"] == 1.0
        assert rows[(device, "llada2-mini", 2.6)]["answer tok/s"] > rows[(device, "llada2-mini", 2.0)]["answer tok/s"]
