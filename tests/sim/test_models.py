"""Cost and behaviour models of the simulator: pure functions and small objects, plain values."""
import json
from dataclasses import dataclass

import numpy as np
import pytest

from dllm_server.decoding.params import BlockPolicy, DecodeParams
from dllm_server.sim.behaviour import (POSITIONS_PER_FORWARD, ParametricBehaviour, ReplayBehaviour, SimRequest,
                                       positions_per_forward)
from dllm_server.costmodel.fitted import FittedCost, fit_iterations, load_cpu_cost, trimmed_fit
from dllm_server.costmodel.gpu import LINKS, MODELS, from_gpu_bench, gpu_cost
from dllm_server.costmodel.iteration import IterationStats as _It
from dllm_server.costmodel.iteration import IterationStats


# ---- GPU roofline ----
def test_model_shapes_match_the_published_sizes():
    llada, dream = MODELS["llada-8b"], MODELS["dream-7b"]
    assert 7.8e9 < llada.linear_params + 2 * llada.head_params < 8.2e9         # "8B"
    assert 7.2e9 < dream.linear_params + 2 * dream.head_params < 7.8e9         # "7B" (Qwen2.5-7B, untied head)
    assert llada.kv_bytes_per_token == 512 * 1024                              # 0.5 MiB per token (docs/gpu.md)
    assert dream.kv_bytes_per_token == 56 * 1024                               # 56 KiB (sangam.md 1.4)


def test_moe_shapes_match_the_published_sizes_and_read_the_experts_the_batch_routes_to():
    mini, flash = MODELS["llada2-mini"], MODELS["llada2-flash"]
    embed = mini.head_params                                                   # untied: embedding + head
    assert 15.5e9 < mini.linear_params + 2 * embed < 16.5e9                    # "16B total"
    assert 1.3e9 < mini.active_linear_params + 2 * embed < 1.5e9              # "1.4B active"
    assert 95e9 < flash.linear_params + 2 * flash.head_params < 105e9         # "about 100B"
    assert 5.8e9 < flash.active_linear_params + 2 * flash.head_params < 6.4e9  # "6.1B active"
    reads = [mini.linear_bytes_read(t) for t in (1, 8, 64, 512, 1 << 20)]
    assert reads == sorted(reads) and reads[-1] <= mini.linear_params * 2 < 1.01 * reads[-1]
    assert reads[0] < 0.1 * reads[-1]                                          # one token: its 8 experts of 256
    cost, dense = gpu_cost("llada2-mini", "h100"), gpu_cost("llada-8b", "h100")

    def step(c, batch, width=32):
        return c.forward_s(_It(decode_tokens=width * batch, decode_keys=1024 * batch, num_decodes=batch))
    assert step(cost, 1, width=1) < step(dense, 1, width=1) / 3     # one token: 8 experts' weights, not 8B
    assert step(cost, 1) > step(dense, 1)             # one block of 32 touches ~160 of 256 experts: 20 GB read
    assert step(cost, 1) < step(cost, 2) < step(cost, 4)   # unlike a dense model, more tokens read more experts
    assert step(cost, 128) < step(dense, 128) / 4     # compute-bound: 1.1B active against 7.5B


def test_block_step_is_flat_until_the_batch_saturates_compute_then_linear():
    cost = gpu_cost("llada-8b", "h100")

    def step(batch):
        return cost.forward_s(_It(decode_tokens=32 * batch, decode_keys=1024 * batch, num_decodes=batch))
    assert step(4) < 1.3 * step(1)                   # memory-bound: weights read once whatever the batch
    assert step(64) > 3 * step(8)                    # compute-bound past ~250 tokens (peak / bandwidth)
    assert 3e-3 < step(1) < 1e-2                     # 14 GB of weights at 80 % of 3.35 TB/s: ~5 ms
    prefill = cost.forward_s(_It(prefill_tokens=1024, prefill_sq=1024 ** 2, num_prefills=1))
    assert prefill > 3 * step(1)                     # a full-canvas forward is compute-bound
    h200 = gpu_cost("llada-8b", "h200")
    assert h200.forward_s(_It(decode_tokens=32, decode_keys=1024, num_decodes=1)) < step(1)   # more bandwidth


def test_turn_adds_host_time_and_transfers_follow_the_link():
    cost = gpu_cost("dream-7b", "h200", link="net-100g")
    it = _It(decode_tokens=33 * 8, decode_keys=8 * 900, num_decodes=8)
    assert cost.turn_s(it) == pytest.approx(cost.forward_s(it) + cost.eff.host_base_s + 8 * cost.eff.host_per_row_s)
    nbytes = cost.kv_bytes(1000)
    assert cost.kv_transfer_s(nbytes) == pytest.approx(LINKS["net-100g"].latency_s + nbytes / (100e9 / 8 * 0.9))
    assert gpu_cost("llada-8b", "h200").kv_pool_tokens() > gpu_cost("llada-8b", "h100").kv_pool_tokens() > 80_000


def test_measured_gpu_run_replaces_the_estimates(tmp_path):
    """A bench/gpu.py JSON made from a known roofline: the fit recovers its efficiencies."""
    truth = gpu_cost("llada-8b", "h200")
    from dataclasses import replace
    truth = replace(truth, eff=replace(truth.eff, memory=0.6, attention=0.4, gemm=0.5, graph_launch_s=0.0,
                                       eager_launch_s=0.0))
    cfg = {"d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "mlp_hidden_size": 12288,
           "vocab_size": 126464, "max_sequence_length": 4096}
    L = 768
    dec = [{"batch": b, "fed_tokens": 32 * b, "graph_step_ms": 1e3 * truth.forward_s(
        _It(decode_tokens=32 * b, decode_keys=b * L, num_decodes=b)), "model_ms": 1.0,
        "step_ms": 1e3 * truth.forward_s(_It(decode_tokens=32 * b, decode_keys=b * L, num_decodes=b)) + 2.0}
        for b in (1, 2, 4, 8, 16, 32, 64)]
    pre = [{"length": n, "model_ms": 1e3 * truth.forward_s(_It(prefill_tokens=n, prefill_sq=n * n, num_prefills=1))}
           for n in (256, 1024, 4096)]
    data = {"meta": {"config": cfg, "gpu": "NVIDIA H200", "gpu_memory_gib": 139.8},
            "gemm": {"peak_tflops": 0.5 * 989}, "decode": {"canvas": L, "q_tokens": 32, "rows": dec},
            "prefill": {"rows": pre}}
    path = tmp_path / "gpu_bench.json"
    path.write_text(json.dumps(data))
    got = from_gpu_bench(path, "llada-8b")
    assert got.eff.gemm == pytest.approx(0.5) and got.eff.memory == pytest.approx(0.6)
    assert got.eff.attention == pytest.approx(0.4) and got.eff.eager_launch_s == pytest.approx(2e-3, rel=0.05)
    assert got.device.name == "NVIDIA H200" and got.name == "gpu-measured"


# ---- the CPU fit ----
def test_fit_recovers_coefficients_and_leaves_out_inbox_waits():
    rng = np.random.default_rng(0)
    rows = []
    for i in range(200):
        d, k = 32 * rng.integers(1, 17), rng.integers(100, 5000)
        p = 0 if i % 2 else rng.integers(50, 700)
        turn = 2e-3 + 1e-5 * d + 2e-3 * k / 1e3 + (1e-4 * p + 5e-3 * p * p / 1e6 if p else 0)
        wait = 0.03 if i % 17 == 0 else 0.0                       # an idle inbox wait inside the turn
        rows.append((d, k, p, p * p, turn + wait, 0.8 * turn))
    fits = fit_iterations(rows)
    assert fits["cache"]["turn"] == pytest.approx([2e-3, 1e-5, 2e-3], rel=1e-3)
    assert fits["recompute"]["turn"][3] == pytest.approx(1e-4, rel=1e-3) and fits["cache"]["turn_left_out"] >= 5
    cost = FittedCost(fits, 5e-4, 1e-4, 8192, 2e9, 4)
    it = IterationStats(prefill_tokens=300, decode_tokens=64, decode_keys=600, prefill_sq=90000, num_prefills=1,
                        num_decodes=2)
    assert cost.turn_s(it) == pytest.approx(2e-3 + 64e-5 + 1.2e-3 + 0.03 + 0.45e-3, rel=1e-3)
    assert cost.forward_s(it) == pytest.approx(0.8 * cost.turn_s(it), rel=1e-3)


def test_trimmed_fit_keeps_a_clean_sample():
    x = np.c_[np.ones(50), np.arange(50.0)]
    coef, kept = trimmed_fit(x, 1 + 2 * np.arange(50.0))
    assert kept.all() and coef == pytest.approx([1, 2])


def test_calibration_file_picks_the_fit_of_the_nearest_worker_count(tmp_path):
    fit = {"cache": {"turn": [1e-3, 0, 0], "forward": [1e-3, 0, 0], "samples": 2, "turn_mean_abs_rel_error": 0}}
    two = {"cache": {**fit["cache"], "turn": [2e-3, 0, 0]}}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"by_workers": {"1": {"fits": fit}, "2": {"fits": two}}, "message_latency_s": 3e-4,
                                "idle_turn_s": 1e-4, "kv_bytes_per_token": 8192, "link_bytes_per_s": 2e9,
                                "num_layers": 4}))
    it = IterationStats(decode_tokens=32, decode_keys=100, num_decodes=1)
    assert load_cpu_cost(path, 1).turn_s(it) == pytest.approx(1e-3)
    assert load_cpu_cost(path, 3).turn_s(it) == pytest.approx(2e-3)
    assert load_cpu_cost(path, 2).message_latency_s == 3e-4


# ---- behaviour ----
@dataclass
class Task:   # what a block task shows the behaviour model (worker/core.py BlockTask)
    request_id: str
    block_index: int
    step: int
    start: int
    end: int
    prompt_len: int
    params: DecodeParams
    policy: BlockPolicy


def params(max_tokens, ignore_eos=False):
    return DecodeParams(max_tokens, 8, 0.0, 1.0, "low_confidence", 0, ignore_eos)


def forwards(b, rid, block, max_tokens, ignore_eos=False, policy=BlockPolicy(0.9)):
    """Run one block to its end as the core would: (columns committed per forward, EOS column)."""
    start = 10 + 8 * block
    out, eos, step, done = [], None, 0, set()
    limit = b.requests[rid][1]
    while True:
        ranges, e = b.commit_range(Task(rid, block, step, start, start + 8, 10, params(max_tokens, ignore_eos), policy))
        cols = [c for lo, hi in ranges for c in range(lo, hi)]
        assert cols and not done & set(cols)
        done |= set(cols)
        out.append(cols)
        eos = e if e is not None else eos
        step += 1
        need = range(0, min(8, (limit + 1 if limit is not None else max_tokens) - 8 * block))
        if all(c in done for c in need):
            return out, eos


def test_positions_per_forward_interpolates_the_cited_points():
    table = POSITIONS_PER_FORWARD["llada-8b"]
    assert positions_per_forward(table, 0.9) == 3.01 and positions_per_forward(table, 0.5) == 4.85
    assert positions_per_forward(table, 0.95) == pytest.approx((3.01 + 1.0) / 2)
    assert all(len(p) == 3 and p[2] for p in table)               # every point names its source


def test_parametric_commits_left_to_right_at_the_published_rate():
    b = ParametricBehaviour(seed=1)
    b.register("a", 0, SimRequest(0, 10, 64, eos_at=None, ignore_eos=True))
    per_block = [len(forwards(b, "a", k, 64, True)[0]) for k in range(8)]
    assert 1.5 < 8 * 8 / sum(per_block) < 4.5                     # ~3 positions per forward
    cols, eos = forwards(b, "a", 0, 64, True)
    assert [c for f in cols for c in f] == list(range(8)) and eos is None
    b.register("e", 1, SimRequest(0, 10, 64, eos_at=11, ignore_eos=False))   # EOS in block 1, column 3
    cols, eos = forwards(b, "e", 1, 64)
    assert eos == 3 and max(c for f in cols for c in f) == 3       # nothing after the EOS is needed
    b.register("s", 2, SimRequest(0, 10, 16, ignore_eos=True))
    cols, _ = forwards(b, "s", 0, 16, True, BlockPolicy(0.9, steps=4))
    assert [len(f) for f in cols] == [2, 2, 2, 2]                  # fixed steps: LLaDA's linear schedule


def test_replay_takes_the_recorded_forwards_and_samples_for_unknown_requests():
    rows = [{"arrival_seq": 0, "steps_per_block": [5, 2, 7], "thresholds": [0.9] * 3, "tokens": 21,
             "block_length": 8, "eos_at": 20},
            {"arrival_seq": 1, "steps_per_block": [8, 8], "thresholds": [0.5, 0.5], "tokens": 16, "block_length": 8,
             "eos_at": None}]
    b = ReplayBehaviour(rows)
    b.register("a", 0, SimRequest(0, 10, 24, eos_at=20, ignore_eos=False))
    assert [len(forwards(b, "a", k, 24)[0]) for k in range(3)] == [5, 2, 7]   # 7 forwards for 5 needed: spares first
    cols, eos = forwards(b, "a", 2, 24)
    assert eos == 4 and cols[-1][-1] == 4 and {c for f in cols[:-1] for c in f} >= {5, 6}
    b.register("x", 9, SimRequest(0, 10, 16, ignore_eos=True))
    assert len(forwards(b, "x", 0, 16, True, BlockPolicy(0.55))[0]) == 8   # drawn from the 0.5 blocks
    assert len(forwards(b, "x", 1, 16, True, BlockPolicy(0.9))[0]) in (5, 2)   # the full 0.9 blocks recorded


def test_tp_cost_splits_the_sharded_work_and_adds_two_all_reduces_a_layer():
    from dataclasses import replace

    from dllm_server.costmodel.gpu import AllReduce
    from dllm_server.costmodel.iteration import IterationStats
    one = gpu_cost("llada-8b", "h100")
    two = gpu_cost("llada-8b", "h100", tp=2)
    assert gpu_cost("llada-8b", "h100", tp=1).forward_s(IterationStats(decode_tokens=32, decode_keys=600,
                                                                          num_decodes=1)) > 0
    layers, hidden = one.model.layers, one.model.hidden
    for it in (IterationStats(decode_tokens=32, decode_keys=600, num_decodes=1),
               IterationStats(decode_tokens=2048, decode_keys=64 * 600, num_decodes=64),
               IterationStats(prefill_tokens=4096, prefill_sq=4096 ** 2, num_prefills=1)):
        free = replace(two, all_reduce=AllReduce(alpha_s=0.0, bus_bytes_per_s=float("inf"), plan_s=0.0))
        base = free.forward_s(it)
        assert base < one.forward_s(it)                    # the projections and attention split two ways
        tokens = it.prefill_tokens + it.decode_tokens
        want = 2 * layers * (20e-6 + 2 * (2 - 1) / 2 * tokens * hidden * 2 / 220e9) + 50e-6
        assert abs(two.forward_s(it) - base - want) < 1e-12
    big = IterationStats(prefill_tokens=4096, prefill_sq=4096 ** 2, num_prefills=1)   # compute-bound: nearly halves
    free = replace(two, all_reduce=AllReduce(0.0, float("inf"), 0.0))
    assert 0.5 < free.forward_s(big) / one.forward_s(big) < 0.56
    assert gpu_cost("llada-8b", "h100", tp=4).kv_pool_tokens() > 4 * one.kv_pool_tokens()
    d = two.describe()
    assert d["tensor_parallel_size"] == 2 and "Triton-distributed#57" in d["all_reduce"]["source"]
    with pytest.raises(ValueError, match="does not divide dream-7b's 28 heads and 4 KV heads"):
        gpu_cost("dream-7b", "h100", tp=8)
