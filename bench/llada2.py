"""LLaDA2 (mixture of experts): 1 the MoE layer on this CPU against a naive per-token loop and against a dense MLP
of the same active size, at 1 / 16 / 64 tokens; 2 a tiny LLaDA2 against a tiny SDAR of the same active size,
offline engine at saturation; 3 SIMULATED (GPU roofline, our real scheduler and worker core) LLaDA2.x-mini
against LLaDA-8B at saturation on one H100 and one H200, and token editing's forwards on the tiny checkpoint.

    python -m bench.llada2 [--threads 2] [--requests 64] [--sim-requests 400] [--json out.json]
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile

import torch

from bench.harness import Report, Timer, median_time_s, parser

# Section 1's layer: LLaDA2.x-mini's routing (256 experts, top 8, 8 groups keep 4, 1 shared) at a quarter of its
# width, so one layer's weights (about 100 MB float32) fit beside the CPU's caches as the real one's do not.
HIDDEN, EXPERT_HIDDEN = 512, 128


def moe_args():
    from dllm_server.model.args import MoEArgs
    return MoEArgs(num_experts=256, top_k=8, expert_hidden=EXPERT_HIDDEN, num_shared=1, first_dense=1, n_group=8,
                   topk_group=4, routed_scaling=2.5, norm_topk=True, expert_bias=True)


def per_token_loop(moe, x: torch.Tensor) -> torch.Tensor:
    """The naive form: route, then every (token, chosen expert) pair as its own one-row MLP."""
    from dllm_server.model.moe import route
    ids, weights = route(moe.gate(x), moe.gate.expert_bias, moe.moe)
    y = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            y[t] += weights[t, j] * moe.experts[int(ids[t, j])](x[t:t + 1])[0]
    return (y + moe.shared_experts(x)).to(x.dtype)


def layer_table(report: Report, reps: int) -> None:
    from dllm_server.model.layers import fuse_layers
    from dllm_server.model.moe import GatedMLP, SparseMoE, route
    torch.manual_seed(0)
    m = moe_args()
    moe = SparseMoE(HIDDEN, m).eval()
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.02)
    dense = GatedMLP(HIDDEN, (m.top_k + m.num_shared) * EXPERT_HIDDEN).eval()   # the same active multiply-adds
    for part in (moe, dense):
        fuse_layers(part)                                  # as the loader serves them: gate and up as one matmul
    moe.fuse()
    table = report.table(["tokens", ("grouped MoE (ms)", ".3f"), ("per-token loop (ms)", ".3f"),
                          ("dense MLP, same active (ms)", ".3f"), ("loop / grouped", ".1f"),
                          ("grouped / dense", ".1f"), "experts touched", ("expert weights read (MB)", ".0f"),
                          ("max |grouped - loop|", ".1e")],
                         f"1. one MoE layer on this CPU: hidden {HIDDEN}, 256 experts of {EXPERT_HIDDEN}, top 8, "
                         f"8 groups keep 4, 1 shared; float32; median of {reps}")
    with torch.inference_mode():
        for n in (1, 16, 64):
            x = torch.randn(n, HIDDEN)
            grouped = median_time_s(lambda: moe(x), reps)
            loop = median_time_s(lambda: per_token_loop(moe, x), max(3, reps // 4))
            flat = median_time_s(lambda: dense(x), reps)
            touched = int(route(moe.gate(x), moe.gate.expert_bias, m)[0].unique().numel())
            err = float((moe(x) - per_token_loop(moe, x)).abs().max())
            read = (touched + m.num_shared) * 3 * HIDDEN * EXPERT_HIDDEN * 4 / 1e6
            table.row(n, 1e3 * grouped, 1e3 * loop, 1e3 * flat, loop / grouped, grouped / flat, touched, read, err)


def _saturation(folder: str, prompts, max_tokens: int, **sampling) -> dict:
    from dllm_server.decoding.params import SamplingParams
    from dllm_server.llm import LLM
    llm = LLM(folder, dtype="float32")
    params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=i, **sampling) for i in range(len(prompts))]
    llm.generate(prompts[:2], params[:2])                    # warm-up
    with Timer() as t:
        outs = llm.generate(prompts, params)
    tokens = sum(len(o.token_ids) for o in outs)
    forwards = sum(o.stats.num_forwards for o in outs)
    return {"tok_s": tokens / t.s, "s": t.s, "forwards": forwards / len(outs), "tpf": tokens / forwards,
            "edits": sum(o.stats.num_edits for o in outs) / len(outs)}


def served_table(report: Report, n: int) -> None:
    import random

    from dllm_server.model.tiny import make_tiny_model
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 250) for _ in range(rng.randrange(20, 120))]} for _ in range(n)]
    shape = dict(hidden=256, layers=4, heads=8, kv_heads=2, head_dim=32, max_len=1024)
    with tempfile.TemporaryDirectory() as tmp:
        # LLaDA2: experts of mlp // 4 = 128, top 2 + 1 shared: 384 active; SDAR: one MLP of 384, block 32 as LLaDA2's.
        llada2 = str(make_tiny_model(f"{tmp}/llada2", arch="llada2", mlp=512, experts=16, experts_per_token=2,
                                     expert_groups=4, **shape))
        sdar = str(make_tiny_model(f"{tmp}/sdar", arch="sdar", mlp=384, block_size=32, **shape))
        table = report.table(["model", "rule", ("answer tok/s", ",.0f"), ("wall (s)", ".1f"), ("forwards/request", ".1f"),
                              ("tokens/forward", ".2f"), ("edits/request", ".0f")],
                             f"\n2. offline engine at saturation on this CPU: {n} requests at once, 96 tokens each; "
                             "hidden 256, 4 layers, 8/2 heads; LLaDA2 16 experts of 128, top 2, 1 shared, first layer "
                             "dense (512); SDAR MLP 384 (the same active width), block 32 both")
        rows = [("tiny SDAR", sdar, {"threshold": 0.7}), ("tiny LLaDA2", llada2, {"threshold": 0.7}),
                ("tiny LLaDA2", llada2, {"threshold": 0.7, "edit_threshold": 0.5, "max_post_edit_steps": 4})]
        for name, folder, rule in rows:
            r = _saturation(folder, prompts, 96, **rule)
            label = ", ".join(f"{k} {v}" for k, v in rule.items())
            table.row(name, label, r["tok_s"], r["s"], r["forwards"], r["tpf"], r["edits"])


def sim_table(report: Report, n: int) -> None:
    from dllm_server.config import ServerConfig
    from dllm_server.costmodel.gpu import MODELS, gpu_cost
    from dllm_server.decoding.canvas import num_blocks
    from dllm_server.sim.behaviour import ParametricBehaviour
    from dllm_server.sim.cluster import Simulator
    from dllm_server.sim.workload import preset_workload

    def run(model: str, device: str, per_forward: float, reqs):
        shape = MODELS[model]
        block = shape.block_size or 32
        cost = gpu_cost(model, device, block_length=block)
        reqs = [dataclasses.replace(r, steps=max(num_blocks(r.max_tokens, block, r.prompt_len, shape.block_size > 0),
                                                 math.ceil(r.max_tokens / per_forward))) for r in reqs]
        cfg = ServerConfig(block_length=block, max_waiting_requests=1 << 20, page_size=16,
                           num_pages=cost.kv_pool_tokens() // 16)
        sim = Simulator(cfg, cost, ParametricBehaviour("llada-8b"), shape.model_info(), logit_shift=shape.logit_shift)
        return sim.run(reqs), cost

    burst = preset_workload("sharegpt", n, 1e9, seed=1, max_len=4096)
    table = report.table(["device", "model", "tokens/forward", ("req/s", ".2f"), ("answer tok/s", ",.0f"),
                          ("vs LLaDA-8B", ".2f"), ("mean latency (s)", ".1f"), ("weights (GB)", ".1f"),
                          ("read per forward at 1 / 64 / 4096 tokens (GB)", "s")],
                         f"\n3. SIMULATED saturation on one GPU (roofline, costmodel/gpu.py): {n} ShareGPT-shaped "
                         "requests at t=0; LLaDA-8B with Fast-dLLM's dual cache and a re-prefill per block of 32, "
                         "LLaDA2.x-mini block-causal with exact KV (block 32)")
    for device in ("h100", "h200"):
        base = None
        for model, per_forward in (("llada-8b", 2.0), ("llada2-mini", 2.0), ("llada2-mini", 2.6)):
            res, cost = run(model, device, per_forward, burst)
            done = [r for r in res.requests if r.latency_s is not None]
            tok_s = sum(r.tokens for r in done) / res.makespan_s
            base = base or tok_s
            shape = MODELS[model]
            reads = " / ".join(f"{shape.linear_bytes_read(t) / 1e9:.1f}" for t in (1, 64, 4096))
            table.row(device, model, per_forward, len(done) / res.makespan_s, tok_s, tok_s / base,
                      statistics.mean(r.latency_s for r in done), shape.weight_bytes / 1e9, reads)
    m = MODELS["llada2-mini"]
    report.add(assumptions={"llada2-mini": m.source, "routing": "uniform over experts (expected experts touched "
                            "E (1 - (1 - k/E)^tokens) per layer)", "efficiency": gpu_cost("llada2-mini", "h100")
                            .describe()["efficiency"], "tokens/forward 2.6": "LLaDA2.0-mini's model card"})
    print(f"\nassumptions: {m.source}; routing uniform over experts; 2.6 tokens/forward: LLaDA2.0-mini's model card; "
          "efficiencies as costmodel/gpu.py's Efficiency")


def main() -> None:
    ap = parser(__doc__, threads=2, json_out=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--sim-requests", type=int, default=400)
    ap.add_argument("--only", default="1,2,3", help="sections to run, e.g. 1,3")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    report = Report(a.json)
    only = set(a.only.split(","))
    if "1" in only:
        layer_table(report, a.reps)
    if "2" in only:
        served_table(report, a.requests)
    if "3" in only:
        sim_table(report, a.sim_requests)
    report.save()


if __name__ == "__main__":
    main()
