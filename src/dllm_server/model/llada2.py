"""LLaDA2.x (`LLaDA2MoeModelLM`): block-causal mixture-of-experts diffusion, Hugging Face parameter names. Attention
has one fused query_key_value projection (GQA), per-head RMSNorm on queries and keys before a partial rotary; the
first `first_k_dense_replace` layers keep a dense MLP, the others are moe.SparseMoE. logits[i] predicts token i."""
from __future__ import annotations

import torch
from torch import nn

from .args import ModelArgs, MoEArgs
from .attention import AttentionBatch, DenseBatch, LayerKV, attend
from .layers import Projections, RMSNorm, embedding, Rotary, ServingLinear, apply_rotary, fuse_layers, residual
from .moe import GatedMLP, SparseMoE

BLOCK_SIZE = 32       # the released checkpoints' block (their config.json does not state it)
# Routing options the released checkpoints use; another value is refused at load rather than served wrong.
ROUTING = {"score_function": "sigmoid", "moe_router_topk_method": "noaux_tc", "hidden_act": "silu"}


def args_from_config(cfg: dict) -> ModelArgs:
    for key, supported in ROUTING.items():
        if cfg.get(key, supported) != supported:
            raise ValueError(f"config: {key} {cfg[key]!r} is not supported (LLaDA2 uses {supported!r})")
    for key in ("norm_head", "use_sliding_window"):
        if cfg.get(key):
            raise ValueError(f"config: {key} true is not supported")
    if cfg.get("rope_scaling"):
        raise ValueError(f"config: rope_scaling {cfg['rope_scaling']!r} is not supported")
    if "mask_token_id" not in cfg:
        raise ValueError("config: no mask_token_id, and the tokenizer names no mask_token")
    n_heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    eos = cfg.get("eos_token_id")
    moe = None
    if cfg.get("num_experts"):
        moe = MoEArgs(num_experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
                      expert_hidden=cfg["moe_intermediate_size"], num_shared=cfg.get("num_shared_experts") or 0,
                      first_dense=cfg.get("first_k_dense_replace", 0), n_group=cfg.get("n_group") or 1,
                      topk_group=cfg.get("topk_group") or 1,
                      routed_scaling=float(cfg.get("routed_scaling_factor", 1.0)),
                      norm_topk=bool(cfg.get("norm_topk_prob", True)),
                      expert_bias=bool(cfg.get("moe_router_enable_expert_bias", True)))
    return ModelArgs(
        arch="llada2", hidden=hidden, num_layers=cfg["num_hidden_layers"], num_heads=n_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or n_heads, mlp_hidden=cfg.get("intermediate_size") or 0,
        vocab_size=cfg["vocab_size"], embedding_size=cfg["vocab_size"],
        rope_theta=float(cfg.get("rope_theta", 10000.0)), norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        max_len=cfg.get("max_position_embeddings", 32768), mask_id=cfg["mask_token_id"],
        eos_id=eos[0] if isinstance(eos, list) else eos, tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("use_qkv_bias", False)), logit_shift=0, explicit_head_dim=head_dim,
        block_size=int(cfg.get("block_size") or BLOCK_SIZE),
        rotary_dim=int(head_dim * float(cfg.get("partial_rotary_factor", 1.0))),
        qk_norm=bool(cfg.get("use_qk_norm", True)), out_bias=bool(cfg.get("use_bias", True)), moe=moe)


class LLaDA2Attention(Projections):
    names = {"qkv": "query_key_value", "o": "dense"}

    def __init__(self, a: ModelArgs):
        super().__init__()
        d = a.head_dim
        self.query_key_value = nn.Linear(a.hidden, (a.num_heads + 2 * a.num_kv_heads) * d, bias=a.qkv_bias)
        self.dense = nn.Linear(a.num_heads * d, a.hidden, bias=a.out_bias)
        self.query_layernorm = RMSNorm(d, a.norm_eps) if a.qk_norm else None
        self.key_layernorm = RMSNorm(d, a.norm_eps) if a.qk_norm else None
        self.init_projections((a.num_heads, a.num_kv_heads, d))

    def forward(self, x, cos, sin, kv: LayerKV | None, batch: AttentionBatch | DenseBatch):
        n_h, n_kv, d = self.shape
        y = (self.qkv or self.query_key_value)(x).view(-1, n_h + 2 * n_kv, d)
        q, k, v = y[:, :n_h], y[:, n_h: n_h + n_kv], y[:, n_h + n_kv:]
        if self.query_layernorm is not None:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        o = attend(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, kv, batch)
        return self.dense(o.flatten(1))


class LLaDA2Layer(nn.Module):
    def __init__(self, a: ModelArgs, index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden, a.norm_eps)
        self.attention = LLaDA2Attention(a)
        self.post_attention_layernorm = RMSNorm(a.hidden, a.norm_eps)
        moe = a.moe
        self.mlp = SparseMoE(a.hidden, moe) if moe and index >= moe.first_dense else GatedMLP(a.hidden, a.mlp_hidden)

    def forward(self, h, cos, sin, kv: LayerKV | None, batch: AttentionBatch | DenseBatch):
        h = residual(self.attention(self.input_layernorm(h), cos, sin, kv, batch), h)
        return residual(self.mlp(self.post_attention_layernorm(h)), h)


class LLaDA2MoeModelLM(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.model = nn.Module()
        self.model.word_embeddings = embedding(a.embedding_size, a.hidden)
        self.model.layers = nn.ModuleList(LLaDA2Layer(a, i) for i in range(a.num_layers))
        self.model.norm = RMSNorm(a.hidden, a.norm_eps)
        if not a.tie_embeddings:
            self.lm_head = nn.Linear(a.hidden, a.embedding_size, bias=False)
        self.rotary = Rotary(a.rope_dim, a.rope_theta, a.max_len)

    def fuse_projections(self) -> None:
        for m in self.modules():
            if isinstance(m, SparseMoE):
                m.fuse()
        fuse_layers(self)
        if not self.args.tie_embeddings:
            self.lm_head = ServingLinear(self.lm_head, rows=self.args.vocab_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch | DenseBatch,
                kv: list[LayerKV] | None, logits_rows: torch.Tensor) -> torch.Tensor:
        """Packed forward; logits only for `logits_rows` of the packed stream."""
        h = self.model.word_embeddings(input_ids)
        cos, sin = self.rotary.tables(positions, h.dtype)
        for layer, layer_kv in zip(self.model.layers, kv or [None] * self.args.num_layers):
            h = layer(h, cos, sin, layer_kv, batch)
        h = self.model.norm(h[logits_rows])
        return h @ self.model.word_embeddings.weight.T if self.args.tie_embeddings else self.lm_head(h)
