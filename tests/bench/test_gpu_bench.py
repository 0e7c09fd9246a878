"""bench/gpu.py: the --smoke run (CPU, tiny shapes) writes every section of the JSON; the full
8B run needs a CUDA device and is skipped without one."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BATCHES = [1, 2, 4, 8, 16, 32, 64]


def run_bench(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.gpu", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def check_sections(r: dict, prefill_lens: list[int]) -> None:
    assert not r["errors"], r["errors"]
    for k in ("date", "torch", "device", "dtype", "config"):
        assert r["meta"][k] is not None, k
    c = r["correctness"]
    assert c["ok"], c
    for case in ("contiguous", "packed_with_gathered_pages"):
        for check in ("refresh", "dual_step_after_refresh"):
            got = c[case][check]
            assert got["ok"] and got["max_rel"] <= got["tol_rel"], (case, check, got)
            assert got["worst_row_mean_rel"] <= got["tol_rel"] and "mean_rel" in got and "argmax_agree" in got
    assert r["gemm"]["peak_tflops"] > 0
    rows = r["decode"]["rows"]
    assert [x["batch"] for x in rows] == BATCHES
    assert all(0 < x["model_ms"] <= x["step_ms"] for x in rows)
    assert r["decode"]["utilisation"]["fraction_of_gemm_peak"] > 0
    assert r["decode"]["saturation"]["output_tok_s_at_1_per_step"] > 0
    graphs = r["decode"]["graphs"]                 # the fixed-shape (CUDA graph) decode path
    assert graphs["ok"] and graphs["shapes"] == len(BATCHES), graphs
    assert all(x["graph_step_ms"] > 0 and x["graph_vs_eager"]["ok"] for x in rows)
    assert [x["length"] for x in r["prefill"]["rows"]] == prefill_lens
    assert all(x["tok_s"] > 0 for x in r["prefill"]["rows"])
    s = r["serving"]
    assert "skipped" not in s, s
    assert s["throughput_ratio"] > 0 and s["mean_latency_ratio"] > 0
    base, default = s["runs"].values()
    assert base["max_decodes_per_iteration"] == 1
    assert base["requests"] == default["requests"] == s["requests"] >= 2
    assert base["errors"] == default["errors"] == 0
    assert base["output_tokens"] == default["output_tokens"]   # same requests, ignore_eos
    assert default["p99_latency_s"] >= default["p50_latency_s"] > 0
    cap = r["capacity"]                            # real server + load generator, both configurations
    assert not cap["skipped"] and not cap["failed"], cap
    assert cap["slo_e2e_ms"] > 0 and cap["capacity_ratio"] > 0 and len(cap["runs"]) == 2
    for run in cap["runs"].values():
        assert run["capacity_req_s"] > 0 and run["probes"] >= 2 and not run["partial"]
        assert any(h["ok"] for h in run["history"])
        assert run["prompts_per_probe"] >= 8 and "server_log_tail" in run and "server_log_notes" in run
    bc = r["block_causal"]                         # SDAR shape: exact KV, fused == separate == no-cache recompute
    assert bc["ok"] and set(bc["runs"]) == {"fused", "separate", "recompute"}, bc
    assert bc["agree_with_fused"] == {"separate": 1.0, "recompute": 1.0} and bc["prefix_cache"]["hit_tokens"] > 0
    assert r["log_tail"] is not None and r["meta"]["tmp_free_gib"] > 0


def test_smoke_run_on_cpu_writes_every_section(tmp_path):
    out = tmp_path / "x.json"
    proc = run_bench(["--smoke", "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["ok"] and r["meta"]["smoke"] and not r["skipped"]
    check_sections(r, [64, 128, 256, 512])
    for check in ("refresh", "dual_step_after_refresh"):   # fp32: the cache path is exact
        assert r["correctness"]["packed_with_gathered_pages"][check]["argmax_agree"] == 1.0
    assert "CUDA" in r["flashinfer"]["skipped"]
    assert "| batch | fed tokens | model step (ms)" in proc.stdout
    assert "| length | model (ms)" in proc.stdout
    assert "throughput ratio default / batch-1" in proc.stdout
    assert "capacity ratio default / batch-1 at matched latency" in proc.stdout


def test_time_budget_skips_phases_and_still_writes_json(tmp_path):
    out = tmp_path / "x.json"
    proc = run_bench(["--smoke", "--out", str(out), "--time-budget-s", "0", "--skip-flashinfer"], timeout=120)
    assert proc.returncode == 1
    r = json.loads(out.read_text())
    assert not r["ok"] and "decode" not in r and "serving" not in r
    assert any(note.startswith("serving:") for note in r["skipped"])


@pytest.mark.gpu
@pytest.mark.timeout(660)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_full_run_on_gpu(tmp_path):
    out = tmp_path / "gpu_bench.json"
    proc = run_bench(["--out", str(out)], timeout=600)
    r = json.loads(out.read_text())
    assert r["meta"]["gpu"], r["meta"]
    assert not r["skipped"], r["skipped"]
    check_sections(r, [256, 512, 1024, 2048, 4096])
    assert r["decode"]["utilisation"]["fraction_of_gemm_peak"] < 1.5
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_flashinfer_phase_helpers_on_cpu():
    """What the GPU-only FlashInfer phase runs around FlashInfer itself: the padded (graph path)
    metadata builder against paged SDPA, and the end-to-end backend comparison with SDPA on both
    sides (its pools, gathered pages, decode batch and timing code)."""
    from bench import gpu_flashinfer as FI
    from bench import gpu_parts as P
    from dllm_server.model.attention import AttentionBatch, SeqSpan, padded_attention, sdpa_attention
    from dllm_server.worker.kv_pool import KVPool

    cpu = torch.device("cpu")
    pool = KVPool(1, 18, 4, 2, 8, torch.float32, cpu)     # 2 + 8 + 6 + 3 - 1 pages: c gets gathered pages
    pool.layers[0].k.normal_(), pool.layers[0].v.normal_()
    pool.allocate("gap", 4), pool.allocate("pin", 4), pool.free("gap")
    allocs = [pool.allocate("a", 30), pool.allocate("b", 21), pool.allocate("c", 9)]
    assert allocs[2].slot_ids is not None
    seqs, q0 = [], 0
    for al, (kv, pos) in zip(allocs, [(30, 10), (21, 5), (9, 0)]):
        seqs.append(SeqSpan(q0, 4, pos, kv, al.slot_base, al.slot_ids, al.pages))
        q0 += 4
    q, k, v = torch.randn(q0, 4, 8), torch.randn(q0, 2, 8), torch.randn(q0, 2, 8)
    want = sdpa_attention(q, k, v, pool.layers[0], AttentionBatch(seqs))
    got = padded_attention(q, k, v, pool.layers[0], FI.padded_batch(seqs, pool, cpu))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    r = FI.backend_check(dict(P.SMOKE_CFG), cpu, torch.float32, P.SMOKE, 16, 4, 0, backends=("sdpa", "sdpa"))
    assert r["ok"] and r["mixed"]["max_rel"] == 0 and r["sdpa_step_ms"] > 0, r
