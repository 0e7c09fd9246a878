"""The GPU run's pre-flight (issue 19), on the CPU: what must not waste the single GPU run.
Correctness gate and report, pages freed after a failing phase, the capacity phase keeping each
configuration's result and staying inside the time left, the FlashInfer pre-check, the
environment record, --only."""
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from bench import gpu_capacity as C
from bench import gpu_env as E
from bench import gpu_flashinfer as FI
from bench import gpu_parts as P
from dllm_server.worker.cuda_graph import DecodeGraphs
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner, fed_range

ROOT = Path(__file__).resolve().parents[2]

CPU = torch.device("cpu")


def bench(args: list[str], timeout: float, prelude: str = "") -> subprocess.CompletedProcess:
    """bench/gpu.py in a child run from the repository root, optionally after `prelude` (e.g. breaking
    one of its parts)."""
    code = (f"import sys; sys.argv = ['gpu.py'] + {args!r}\n"
            f"import bench.gpu as gpu\n{prelude}\nsys.exit(gpu.main())")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# ---- item 2: the correctness gate ----
def test_compare_reports_max_mean_row_and_argmax():
    ref = torch.randn(6, 32, 100)
    r = P.compare(ref + 1e-3 * torch.randn_like(ref), ref, 1e-2)
    for k in ("max_abs", "mean_abs", "max_rel", "mean_rel", "worst_row_mean_rel", "argmax_agree", "tol_rel"):
        assert isinstance(r[k], float), k
    assert r["ok"] and 0 < r["mean_rel"] <= r["worst_row_mean_rel"] < 1e-2 and r["argmax_agree"] > 0.9
    assert P.tolerance(torch.float32) == 1e-4 and P.tolerance(torch.bfloat16) == 0.1


def noise_of_size(ref: torch.Tensor, rel: float, seed: int) -> torch.Tensor:
    """Gaussian noise scaled so its largest element is exactly `rel` x ref's largest magnitude."""
    n = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    return n * (rel * ref.float().abs().max() / n.abs().max())


def test_bf16_tolerance_passes_path_noise_and_fails_a_wrong_sequence():
    """An 8-layer bf16 model of the benchmarked kind (narrow and shallow, so the CPU runs it in
    seconds: bf16 is emulated on CPUs without bf16 instructions, 94 s for 32 layers on an AMD
    EPYC). The graph path against the eager one passes, whatever this CPU's kernels make of it
    (bit-identical on some, ~1.5e-2 apart on others). The tolerance itself is proven on noise of a known size added
    to the eager logits: bf16 noise as large as two independently rounded paths reach (4e-2,
    gpu_parts.tolerance) passes, noise of twice the tolerance fails, and one sequence carrying
    another's logits (what a wrong page table does) fails on its row."""
    cfg = {**P.LLADA_8B, "d_model": 256, "n_layers": 8, "n_heads": 2, "n_kv_heads": 2, "mlp_hidden_size": 768,
           "vocab_size": 4096, "embedding_size": 4096, "mask_token_id": 4000, "eos_token_id": 4001}
    model, args = P.build_model(cfg, CPU, torch.bfloat16, 0)
    L, s, block, n = 384, 256, 32, 4   # keys padded 384 -> 512: another SDPA blocking than eager
    pool = KVPool(args.num_layers, n * L // 16 + 1, 16, args.num_kv_heads, args.head_dim, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    canvases = [P.canvas(args, s, L - s, block, g) for _ in range(n)]
    eager = ModelRunner(model, args, pool, CPU)
    with P.held(pool, {f"r{i}": L for i in range(n)}) as allocs:
        eager.forward([ForwardItem(c, a, 0, L, s, s + block) for c, a in zip(canvases, allocs)])
        lo, hi = fed_range("dual", False, s, s + block, L, args.logit_shift)
        items = [ForwardItem(c, a, lo, hi, s, s + block) for c, a in zip(canvases, allocs)]
        want = eager.forward(items).clone()
        graphs = DecodeGraphs(model, args, pool, CPU, n, capture=False)
        got = ModelRunner(model, args, pool, CPU, decode_graphs=graphs).forward(items, decode_only=True).clone()
    tol = P.tolerance(torch.bfloat16)
    path = P.compare(got, want, tol)
    assert path["ok"] and path["max_rel"] < tol / 2, path
    noisy = P.compare(want.float() + noise_of_size(want, 4e-2, 1), want, tol)
    assert noisy["ok"] and abs(noisy["max_rel"] - 4e-2) < 1e-3, noisy
    loud = P.compare(want.float() + noise_of_size(want, 2 * tol, 2), want, tol)
    assert not loud["ok"], loud
    wrong = want.clone()
    wrong[0] = want[1]
    bug = P.compare(wrong, want, tol)
    assert not bug["ok"] and bug["worst_row_mean_rel"] > 3 * tol, bug


# ---- item 3: pages freed when a phase fails ----
def test_held_frees_every_allocated_owner_when_the_body_or_an_allocation_raises():
    pool = KVPool(1, 10, 4, 1, 8, torch.float32)
    with pytest.raises(ValueError):
        with P.held(pool, {"a": 16, "b": 8}):
            raise ValueError("boom")
    assert pool.num_free_pages == 10 and not pool.owners()
    with pytest.raises(RuntimeError, match="out of KV pages"):
        with P.held(pool, {"a": 16, "b": 400}):
            pass
    assert pool.num_free_pages == 10 and not pool.owners()


def test_a_decode_failure_leaves_the_prefill_phase_its_pages(tmp_path):
    out = tmp_path / "x.json"
    prelude = ("class Boom:\n    def __init__(self, *a, **k): raise RuntimeError('injected decode failure')\n"
               "gpu.DecodeGraphs = Boom")
    proc = bench(["--smoke", "--skip-serving", "--skip-flashinfer", "--out", str(out)], 180, prelude)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert "injected decode failure" in r["errors"]["decode"] and "decode_rows" in r["tracebacks"]["decode"]
    assert set(r["errors"]) == {"decode"}, r["errors"]
    assert [x["length"] for x in r["prefill"]["rows"]] == [64, 128, 256, 512]


# ---- item 4: logs kept in the JSON; item 8: --only ----
def test_only_runs_the_named_phases_and_keeps_the_log_tail(tmp_path):
    out = tmp_path / "x.json"
    prelude = ("import logging\ngemm_rates = gpu.P.gemm_rates\n"
               "def logged(*a, **k):\n    logging.getLogger('dllm_server.test').info('hello from the bench log')\n"
               "    return gemm_rates(*a, **k)\ngpu.P.gemm_rates = logged")
    proc = bench(["--smoke", "--only", "gemm", "--out", str(out)], 120, prelude)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["ok"] and "gemm" in r and "model" in r and "decode" not in r and "capacity" not in r
    assert {n.split(":")[0] for n in r["skipped"]} >= {"correctness", "decode", "prefill", "serving", "capacity"}
    assert any("hello from the bench log" in line for line in r["log_tail"])
    assert r["meta"]["tmp_free_gib"] > 0 and "shm_free_gib" in r["meta"]
    assert bench(["--smoke", "--only", "nope"], 60).returncode == 2


# ---- item 1: the capacity phase ----
def test_plan_prompts_shrinks_the_probes_to_the_time_left_and_gives_up_below_the_floor():
    one, tol = 0.3, 0.15
    full = C.plan_prompts(one, 1e6, 24, tol)
    assert full == 24 and C.search_estimate_s(one, 24, tol) < 120
    mid = C.plan_prompts(one, C.search_estimate_s(one, 12, tol), 24, tol)
    assert mid == 12
    assert C.plan_prompts(one, C.search_estimate_s(one, C.MIN_PROMPTS, tol) - 1, 24, tol) is None


def test_probes_of_a_cut_search_are_recovered_from_loadgen_files(tmp_path):
    for rate, frac in ((2.0, 1.0), (4.0, 0.95), (8.0, 0.5)):
        (tmp_path / f"cap-capacity-rate{rate:g}.json").write_text(json.dumps(
            {"config": {"request_rate": f"{rate:g}"}, "summary": {"goodput": {"fraction": frac}}}))
        time.sleep(0.01)
    (tmp_path / "cap-capacity-rate16.json").write_text("{truncated")
    h = C.probes_so_far(tmp_path, 0.9)
    assert [x["rate"] for x in h] == [2.0, 4.0, 8.0] and [x["ok"] for x in h] == [True, True, False]
    assert C.bounds(h) == {"capacity": 4.0, "upper": 8.0, "bracketed": True}


def test_unloaded_latency_never_outlives_its_deadline():
    with socket.socket() as srv:          # accepts connections, never answers
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        t = time.monotonic()
        with pytest.raises((httpx.TimeoutException, TimeoutError)):
            C.unloaded_latency_s(url, {}, time.monotonic() + 2.5)
        assert time.monotonic() - t < 5
        with pytest.raises(TimeoutError):
            C.unloaded_latency_s(url, {}, time.monotonic() + 0.5)


def test_capacity_skips_configurations_without_starting_them_when_time_is_short(tmp_path):
    t = time.monotonic()
    r = C.capacity_comparison(tmp_path / "no-checkpoint", P.llada.args_from_config(P.SMOKE_CFG), P.SMOKE, "cpu",
                              "float32", lambda: C.MIN_CONFIG_S - 1, 0, tmp_path)
    assert time.monotonic() - t < 2 and not r["runs"] and not r["failed"]
    assert set(r["skipped"]) == {C.BASELINE[0], C.DEFAULT[0]} and r["capacity_ratio"] is None


@pytest.mark.timeout(240)
def test_capacity_keeps_the_baseline_when_the_second_configuration_fails(tmp_path):
    cfg = dict(P.SMOKE_CFG)
    ckpt = P.write_checkpoint(cfg, 2, CPU, torch.float32, 0, tmp_path / "ckpt")
    work = tmp_path / "work"
    work.mkdir()
    deadline = time.monotonic() + 150
    broken = ("broken server", ["--no-such-flag"])
    r = C.capacity_comparison(ckpt, P.llada.args_from_config(cfg), P.SMOKE, "cpu", "float32",
                              lambda: deadline - time.monotonic(), 0, work, configs=(C.BASELINE, broken))
    base = r["runs"][C.BASELINE[0]]
    assert base["capacity_req_s"] > 0 and base["probes"] >= 2 and not base["partial"]
    assert base["prompts_per_probe"] == P.SMOKE.capacity_prompts and "server_log_tail" in base
    assert r["slo_from"] == C.BASELINE[0] and r["slo_e2e_ms"] > 0
    f = r["failed"]["broken server"]
    assert "server exited" in f["error"] and "no-such-flag" in f["server_log_tail"]
    assert r["capacity_ratio"] is None and not r["skipped"]


# ---- item 6: FlashInfer pre-check without a child ----
def test_flashinfer_phase_reports_its_absence_without_a_child(tmp_path, monkeypatch):
    def no_child(*a, **k):
        raise AssertionError("spawned a child")
    monkeypatch.setattr(FI.subprocess, "Popen", no_child)
    args = ("bench.gpu", tmp_path / "x.json")
    assert "CUDA" in FI.run_child(*args, CPU, torch.float32, 0, True, None, 10)["skipped"]
    monkeypatch.setattr(FI.importlib.util, "find_spec", lambda name: None)
    r = FI.run_child(*args, torch.device("cuda"), torch.bfloat16, 0, False, None, 10)
    assert "not installed" in r["skipped"]


# ---- item 5: the environment record ----
def test_env_checks_flag_old_anyio_and_pydantic():
    assert E.checks({"anyio": "4.16.0", "pydantic": "2.14.4"}) == []
    w = E.checks({"anyio": "3.7.1", "pydantic": "1.10.2"})
    assert len(w) == 2 and "anyio 3.7.1" in w[0] and "pydantic 1.10.2" in w[1]


def test_env_record_lists_the_serving_stack_and_free_space():
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_env"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "NO_PROXY": "127.0.0.1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("anyio==", "starlette==", "pydantic==", "uvicorn==", "httpx==", "torch==", "dllm-server=="):
        assert name in proc.stdout, name
    assert "free space tmp" in proc.stdout and "free space shm" in proc.stdout
    assert "serving stack: OK" in proc.stdout and "NO_PROXY='127.0.0.1'" in proc.stdout


def test_random_prompt_ids_avoid_special_tokens_wherever_a_model_puts_them():
    from dllm_server.checkpoint import embedded_model_path, read_config
    top = P.llada.args_from_config(P.SMOKE_CFG)                      # specials at the top
    assert P.prompt_id_range(top) == (1, min(top.vocab_size, top.mask_id, top.eos_id))
    demo = P.llada.args_from_config(read_config(embedded_model_path()))   # the demo model v2: specials 0-5 first
    lo, hi = P.prompt_id_range(demo)
    assert (lo, hi) == (6, demo.vocab_size) and demo.mask_id < lo and demo.eos_id < lo
    g = torch.Generator().manual_seed(0)
    c = P.canvas(demo, 64, 64, 32, g)
    assert bool((c[:64] >= lo).all())                                # the prompt holds no special token
