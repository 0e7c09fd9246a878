"""Roofline GPU cost models (H100 / H200): each kernel class is bound by its FLOPs or its bytes, plus a host term.
Constants are cited or marked as assumptions; `from_gpu_bench` refits the efficiencies to a bench/gpu.py run."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..messages import ModelInfo
from .iteration import IterationStats


@dataclass(frozen=True)
class MoEShape:
    experts: int
    top_k: int
    expert_hidden: int
    shared: int
    dense_layers: int          # the first layers keep a dense MLP (mlp_hidden wide)

    def sparse_layers(self, layers: int) -> int:
        return layers - self.dense_layers

    def active_params(self, hidden: int) -> int:
        return (self.top_k + self.shared) * 3 * hidden * self.expert_hidden + hidden * self.experts   # + router

    def idle_params(self, hidden: int) -> int:
        return (self.experts - self.top_k) * 3 * hidden * self.expert_hidden


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp_hidden: int
    vocab: int
    logit_shift: int           # Dream predicts position p from p - 1: a decode feeds one more token
    max_len: int
    mask_id: int
    eos_id: int
    source: str
    bytes_per_param: int = 2
    block_size: int = 0        # > 0: block-causal (SDAR), decoding in blocks of this width on the absolute grid
    moe: "MoEShape | None" = None   # a mixture-of-experts MLP in all but the first `moe.dense_layers` layers

    @property
    def _attn_params(self) -> int:
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def linear_params(self) -> int:
        """Every projection held in memory (MoE: every expert)."""
        if self.moe is None:
            return self.layers * (self._attn_params + 3 * self.hidden * self.mlp_hidden)
        return self.active_linear_params + self.moe.sparse_layers(self.layers) * self.moe.idle_params(self.hidden)

    @property
    def active_linear_params(self) -> int:
        """Projections one token multiplies (MoE: its top-k experts and the shared ones)."""
        if self.moe is None:
            return self.linear_params
        m = self.moe
        dense = m.dense_layers * 3 * self.hidden * self.mlp_hidden
        return self.layers * self._attn_params + dense + m.sparse_layers(self.layers) * m.active_params(self.hidden)

    def linear_bytes_read(self, tokens: int) -> float:
        """Projection weights one forward over `tokens` reads: all of a dense model; under MoE the dense part
        and the experts the batch routes to (uniform routing: E (1 - (1 - k/E)^tokens) per layer, an assumption)."""
        if self.moe is None:
            return self.linear_params * self.bytes_per_param
        m = self.moe
        touched = m.experts * (1.0 - (1.0 - m.top_k / m.experts) ** max(tokens, 1))
        per_layer = (m.shared + touched) * 3 * self.hidden * m.expert_hidden + self.hidden * m.experts
        dense = self.layers * self._attn_params + m.dense_layers * 3 * self.hidden * self.mlp_hidden
        return (dense + m.sparse_layers(self.layers) * per_layer) * self.bytes_per_param

    @property
    def head_params(self) -> int:
        return self.hidden * self.vocab

    @property
    def weight_bytes(self) -> int:
        return (self.linear_params + 2 * self.head_params) * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    def model_info(self) -> ModelInfo:
        return ModelInfo(self.name, self.vocab, self.vocab, self.mask_id, self.eos_id, self.max_len, self.hidden,
                         self.layers, self.heads, self.kv_heads, self.head_dim, self.mlp_hidden, self.block_size)


MODELS = {
    "llada-8b": ModelShape("llada-8b", 4096, 32, 32, 32, 128, 12288, 126464, 0, 4096, 126336, 126081,
                           "LLaDA-8B config.json (dllm_algorithms.md 1.2)"),
    "dream-7b": ModelShape("dream-7b", 3584, 28, 28, 4, 128, 18944, 152064, 1, 131072, 151666, 151643,
                           "Dream-v0-7B config (dllm_algorithms.md 2.1)"),
    "sdar-8b": ModelShape("sdar-8b", 4096, 36, 32, 8, 128, 12288, 151936, 0, 32768, 151669, 151643,
                          "assumption: SDAR-8B-Chat has Qwen3-8B's layout (hidden 4096, 36 layers, 32/8 heads, MLP "
                          "12288), its block_size 4 and mask_token_id 151669 (ray_and_block_causal.md, SDAR's "
                          "config.json)", block_size=4),
    "llada2-mini": ModelShape("llada2-mini", 2048, 20, 16, 4, 128, 5120, 157184, 0, 32768, 156895, 156892,
                              "LLaDA2.x-mini config.json (field_2026-12.md 1): 256 experts of 512, top 8, 1 shared, "
                              "first layer dense; assumptions: its dense MLP 5120 wide and vocabulary 157184 "
                              "(Ling-mini-2.0's)", block_size=32, moe=MoEShape(256, 8, 512, 1, 1)),
    "llada2-flash": ModelShape("llada2-flash", 4096, 32, 32, 4, 128, 9216, 157184, 0, 32768, 156895, 156892,
                               "assumption: LLaDA2.x-flash as Ling-flash-2.0 (hidden 4096, 32 layers, 32/4 heads, 256 "
                               "experts of 1024, top 8, 1 shared, first layer dense, dense MLP 9216); gives 103B "
                               "total, 6.1B active (inclusionAI/LLaDA2.X: about 100B / 6.1B)",
                               block_size=32, moe=MoEShape(256, 8, 1024, 1, 1)),
}


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float          # dense bf16, FLOP/s
    mem_bytes_per_s: float
    memory_bytes: float
    source: str


DEVICES = {
    "h100": Device("H100 SXM5 80 GB", 989e12, 3.35e12, 80e9,
                   "NVIDIA H100 datasheet: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GB"),
    "h200": Device("H200 SXM 141 GB", 989e12, 4.8e12, 141e9,
                   "NVIDIA H200 datasheet: 989 TFLOP/s dense bf16 (the H100's compute), 4.8 TB/s HBM3e, 141 GB"),
}


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float         # one direction, after an efficiency factor
    latency_s: float
    source: str


LINKS = {
    "nvlink": Link("NVLink 4", 450e9 * 0.8, 10e-6, "900 GB/s bidirectional per H100/H200 SXM GPU (datasheet); "
                   "x 0.8 achieved (assumption); 10 us per transfer (assumption)"),
    "pcie5": Link("PCIe 5.0 x16", 64e9 * 0.8, 10e-6, "64 GB/s per direction (spec); x 0.8 (assumption)"),
    **{f"net-{g}g": Link(f"{g} Gb/s network", g * 1e9 / 8 * 0.9, 20e-6,
                         f"{g} Gb/s line rate x 0.9 achieved (assumption); 20 us per transfer (assumption)")
       for g in (25, 100, 200, 400)},
}


@dataclass(frozen=True)
class Efficiency:
    """Shares of peak per kernel class, and host seconds per turn and per row: assumptions unless fitted."""
    gemm: float = 0.7              # large bf16 GEMMs: 60-80 % of peak on H100 is typical
    attention: float = 0.5         # FlashAttention-2 reports 50-73 % of A100 peak
    memory: float = 0.8
    eager_launch_s: float = 2e-3   # iterations with a prefill: ~400 kernels x 5 us
    graph_launch_s: float = 1e-4   # decode-only iterations replay a CUDA graph
    host_base_s: float = 1e-3
    host_per_row_s: float = 6e-5
    source: str = "assumptions (docs/simulation.md)"


@dataclass(frozen=True)
class AllReduce:
    """A ring all-reduce within a tensor-parallel instance: alpha + 2 (d - 1) / d x bytes / bus, two per layer."""
    alpha_s: float = 20e-6
    bus_bytes_per_s: float = 220e9
    plan_s: float = 50e-6             # the leader's plan broadcast per iteration
    source: str = ("torch.distributed NCCL all-reduce on 8 x H100 in one node: 19-25 us from 128 B to 512 KB, "
                   "the bus rate fitted to the same measurement's 4/8/16 MB points (59/91/136 us), a user's "
                   "report in ByteDance-Seed/Triton-distributed#57 (shared/reference/cluster_level.md 6.2); "
                   "plan broadcast: assumption")

    def seconds(self, degree: int, num_bytes: float) -> float:
        return 0.0 if degree <= 1 else self.alpha_s + 2 * (degree - 1) / degree * num_bytes / self.bus_bytes_per_s


SAMPLING_BYTES_PER_LOGIT = 4 + 2 * 8   # fp32 logits written, a float64 confidence written and read (docs/gpu.md)
KV_POOL_SHARE = 0.7   # of the memory the weights leave: the Sangam paper's LLaDA pool on an H100 (docs/simulation.md)


@dataclass
class RooflineCost:
    model: ModelShape
    device: Device
    link: Link
    block_length: int
    eff: Efficiency = Efficiency()
    message_latency_s: float = 2e-4   # this and idle_turn_s: assumptions
    idle_turn_s: float = 1e-4
    name: str = "gpu-roofline"
    tp: int = 1
    all_reduce: AllReduce = AllReduce()

    @property
    def num_layers(self) -> int:
        return self.model.layers

    def kv_pool_tokens(self) -> int:
        """KV tokens over the instance's d GPUs (projections split d ways, embedding and LM head whole)."""
        m, d = self.model, self.tp
        linear_bytes = m.linear_params * m.bytes_per_param
        per_gpu = self.device.memory_bytes - (m.weight_bytes - linear_bytes) - linear_bytes / d
        return int(d * per_gpu * KV_POOL_SHARE / m.kv_bytes_per_token)

    def __setattr__(self, name, value) -> None:
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_terms", None)      # a changed field invalidates the constants
        object.__setattr__(self, "_memo", None)

    def _constants(self) -> tuple:
        """forward_s's constants, computed once, in the same order as written out inline: the same floats."""
        m, d, e = self.model, self.device, self.eff
        gemm, attn_rate, bw = d.peak_flops * e.gemm, d.peak_flops * e.attention, d.mem_bytes_per_s * e.memory
        lp, hp = m.active_linear_params, m.head_params
        terms = (gemm, attn_rate, bw, self.block_length, 2 * lp, m.linear_bytes_read(1 << 30) / bw, 2 * hp,
                 hp * m.bytes_per_param, m.vocab, 4 * m.layers * m.heads * m.head_dim, m.kv_bytes_per_token,
                 e.eager_launch_s, e.graph_launch_s)
        object.__setattr__(self, "_terms", terms)
        return terms

    def forward_s(self, it) -> float:
        key = (it.prefill_tokens, it.decode_tokens, it.decode_keys, it.prefill_sq, it.num_prefills, it.num_decodes)
        memo = getattr(self, "_memo", None)          # the simulator asks twice per turn
        if memo is not None and memo[0] == key:
            return memo[1]
        s = self._forward_s(it)
        object.__setattr__(self, "_memo", (key, s))
        return s

    def _forward_s(self, it) -> float:
        rows = it.num_prefills + it.num_decodes
        if rows == 0:
            return 0.0
        if self.tp > 1:
            return self._tp_forward_s(it)
        (gemm, attn_rate, bw, block_length, lin_flops, lin_bytes_s, head_flops, head_bytes, vocab, attn_coef,
         kv_bytes, eager_s, graph_s) = getattr(self, "_terms", None) or self._constants()
        tokens = it.prefill_tokens + it.decode_tokens
        logit_rows = rows * block_length           # our engine computes logits at block positions only
        if self.model.moe is not None:
            lin_bytes_s = self.model.linear_bytes_read(tokens) / bw
        linear = max(lin_flops * tokens / gemm, lin_bytes_s)
        head = max(head_flops * logit_rows / gemm, (head_bytes + logit_rows * vocab * 4) / bw)
        q_per_decode = it.decode_tokens / it.num_decodes if it.num_decodes else 0.0
        attn_flops = attn_coef * (it.prefill_sq + q_per_decode * it.decode_keys)
        attn_bytes = kv_bytes * (it.decode_keys + 2 * it.prefill_tokens)
        attention = max(attn_flops / attn_rate, attn_bytes / bw)
        sampling = logit_rows * vocab * SAMPLING_BYTES_PER_LOGIT / bw
        launch = eager_s if it.num_prefills else graph_s
        return max(linear + head + attention + sampling, launch)

    def _tp_forward_s(self, it) -> float:
        """Projections and attention split d ways; head and sampling stay whole on the leader."""
        (gemm, attn_rate, bw, block_length, lin_flops, lin_bytes_s, head_flops, head_bytes, vocab, attn_coef,
         kv_bytes, eager_s, graph_s) = getattr(self, "_terms", None) or self._constants()
        d, rows = self.tp, it.num_prefills + it.num_decodes
        tokens = it.prefill_tokens + it.decode_tokens
        logit_rows = rows * block_length
        if self.model.moe is not None:
            lin_bytes_s = self.model.linear_bytes_read(tokens) / bw
        linear = max(lin_flops * tokens / gemm, lin_bytes_s) / d
        head = max(head_flops * logit_rows / gemm, (head_bytes + logit_rows * vocab * 4) / bw)
        q_per_decode = it.decode_tokens / it.num_decodes if it.num_decodes else 0.0
        attention = max(attn_coef * (it.prefill_sq + q_per_decode * it.decode_keys) / attn_rate,
                        kv_bytes * (it.decode_keys + 2 * it.prefill_tokens) / bw) / d
        sampling = logit_rows * vocab * SAMPLING_BYTES_PER_LOGIT / bw
        launch = eager_s if it.num_prefills else graph_s
        reduce = 2 * self.model.layers * self.all_reduce.seconds(d, tokens * self.model.hidden *
                                                                  self.model.bytes_per_param)
        return max(linear + head + attention + sampling, launch) + reduce + self.all_reduce.plan_s

    def turn_s(self, it) -> float:
        return self.forward_s(it) + self.eff.host_base_s + self.eff.host_per_row_s * (it.num_prefills + it.num_decodes)

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.model.kv_bytes_per_token

    def kv_transfer_s(self, num_bytes: int) -> float:
        return self.link.latency_s + num_bytes / self.link.bytes_per_s

    def describe(self) -> dict:
        return {"cost_model": self.name, "model": asdict(self.model), "device": asdict(self.device),
                "link": asdict(self.link), "efficiency": asdict(self.eff),
                "message_latency_ms": 1e3 * self.message_latency_s, "kv_pool_tokens": self.kv_pool_tokens(),
                "tensor_parallel_size": self.tp, "all_reduce": asdict(self.all_reduce),
                "kv_pool_share": KV_POOL_SHARE, "sampling_bytes_per_logit": SAMPLING_BYTES_PER_LOGIT}


def gpu_cost(model: str, device: str, link: str = "nvlink", block_length: int = 32,
             eff: Efficiency | None = None, tp: int = 1) -> RooflineCost:
    m = MODELS[model]
    if m.heads % tp or m.kv_heads % tp:
        raise ValueError(f"tensor_parallel_size: {tp} does not divide {model}'s {m.heads} heads and {m.kv_heads} KV heads")
    return RooflineCost(m, DEVICES[device], LINKS[link], block_length, eff or Efficiency(), tp=tp)


def _shape_of(cfg: dict) -> ModelShape:
    heads = cfg["n_heads"]
    return ModelShape("measured", cfg["d_model"], cfg["n_layers"], heads, cfg.get("n_kv_heads", heads),
                      cfg["d_model"] // heads, cfg["mlp_hidden_size"], cfg["vocab_size"], 0,
                      cfg.get("max_sequence_length", 4096), cfg.get("mask_token_id", 0), cfg.get("eos_token_id", 1),
                      "bench/gpu.py meta.config")


def _best(grid, err):
    return min(grid, key=err)


def from_gpu_bench(path: str | Path, model: str, link: str = "nvlink", block_length: int = 32) -> RooflineCost:
    """Efficiencies fitted to a bench/gpu.py run (docs/gpu.md); `model` may differ from the one benchmarked."""
    data = json.loads(Path(path).read_text())
    meta = data["meta"]
    bench = _shape_of(meta["config"])
    mem = (meta.get("gpu_memory_gib") or 80) * 2**30
    base = DEVICES["h200"] if mem > 100e9 else DEVICES["h100"]
    device = replace(base, name=meta.get("gpu") or base.name, memory_bytes=mem,
                     source=f"{base.source}; measured: {path}")
    cost = RooflineCost(bench, device, LINKS[link], data.get("decode", {}).get("q_tokens", block_length))
    eff = cost.eff
    peak = (data.get("gemm") or {}).get("peak_tflops")
    if peak:
        eff = replace(eff, gemm=min(1.0, peak * 1e12 / device.peak_flops))
    grid = [i / 100 for i in range(5, 101)]
    dec = data.get("decode") or {}
    rows = [r for r in dec.get("rows", []) if r.get("graph_step_ms")]
    L, q = dec.get("canvas"), dec.get("q_tokens")

    def decode_it(r):
        return IterationStats(decode_tokens=r["fed_tokens"], decode_keys=r["batch"] * L, num_decodes=r["batch"])

    def rel_err(c, pairs):
        return sum((c.forward_s(it) * 1e3 - ms) ** 2 / ms ** 2 for it, ms in pairs)

    if rows and L and q:
        pairs = [(decode_it(r), r["graph_step_ms"]) for r in rows]
        eff = replace(eff, memory=_best(grid, lambda g: rel_err(replace(cost, eff=replace(eff, memory=g, graph_launch_s=0)),
                                                                   pairs)), graph_launch_s=0.0)
        small = [r for r in dec["rows"] if r["batch"] <= 4]
        c0 = replace(cost, eff=replace(eff, eager_launch_s=0.0))
        if small:
            resid = sorted(r["step_ms"] / 1e3 - c0.forward_s(decode_it(r)) for r in small)
            eff = replace(eff, eager_launch_s=max(0.0, resid[len(resid) // 2]))
    pre = [r for r in (data.get("prefill") or {}).get("rows", []) if r.get("model_ms")]
    if pre:
        pairs = [(IterationStats(prefill_tokens=r["length"], prefill_sq=r["length"] ** 2, num_prefills=1),
                  r["model_ms"]) for r in pre]
        eff = replace(eff, attention=_best(grid, lambda g: rel_err(replace(cost, eff=replace(eff, attention=g,
                                                                                      eager_launch_s=0)), pairs)))
    serving = ((data.get("serving") or {}).get("runs") or {})
    runs = [v for v in serving.values() if isinstance(v, dict) and v.get("iterations") and v.get("forward_share")]
    if runs:
        r = max(runs, key=lambda v: v["iterations"])
        eff = replace(eff, host_base_s=r["wall_s"] * (1 - r["forward_share"]) / r["iterations"], host_per_row_s=0.0)
    eff = replace(eff, source=f"fitted to {path}")
    return RooflineCost(MODELS[model], device, LINKS[link], block_length, eff, name="gpu-measured")
