"""The load generator against our real server for a few seconds: the JSON result holds every
per-request array and the diffusion counters scraped from /metrics."""
import json
import subprocess
import sys


def test_loadgen_runs_against_the_server(server, tmp_path, tiny_llada):
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "loadgen", "--base-url", server.url, "--dataset", "random", "--vocab-size", "250",
           "--id-low", "1", "--prompt-len", "24", "--spread", "0", "--output-len", "16", "--ignore-eos",
           "--num-prompts", "12", "--num-warmups", "1", "--request-rate", "8", "--seed", "1",
           "--extra-body", json.dumps({"threshold": 0.9, "stream_options": {"include_progress": True}}),
           "--tokenizer", tiny_llada, "--result-file", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    text = json.dumps(res)
    assert "ttft" in text and "dllm:" in text
    reqs = res["requests"]
    assert {len(reqs[k]) for k in ("ttfts", "latencies", "output_lens", "start_times", "itls")} == {12}
    assert all(t <= e for t, e in zip(reqs["ttfts"], reqs["latencies"]))
    assert res["summary"]["completed"] == 12 and res["summary"]["failed"] == 0
    assert reqs["usage_output_tokens"] == [16] * 12
    assert len(reqs["token_mismatch"]) == 12      # random bytes re-tokenise differently: flagged, not hidden
    assert all(n > 0 for n in reqs["progress_chunks"])        # progress chunks seen, kept out of TTFT
    deltas = res["server_metrics"]["deltas"]

    def delta(name):
        return sum(v for k, v in deltas.items() if k.split("{")[0] == name)
    assert delta("dllm:generation_tokens_total") >= 12 * 16      # warm-up excluded or not, at least these
    assert delta("dllm:denoising_steps_total") > 0 and delta("dllm:canvas_positions_total") > 0
