"""LLaDA (`LLaDAModelLM`): a LLaMA-style transformer without a causal mask, HF parameter names; logits[i] predicts i."""
from __future__ import annotations

import torch
from torch import nn

from .args import ModelArgs
from .attention import AttentionBatch, DenseBatch, LayerKV, attend
from .layers import Projections, RMSNorm, embedding, Rotary, ServingLinear, fuse_layers, residual


def args_from_config(cfg: dict) -> ModelArgs:
    n_heads = cfg["n_heads"]
    vocab = cfg["vocab_size"]
    mlp = cfg.get("mlp_hidden_size") or cfg.get("mlp_ratio", 4) * cfg["d_model"]
    return ModelArgs(
        arch="llada", hidden=cfg["d_model"], num_layers=cfg["n_layers"], num_heads=n_heads,
        num_kv_heads=cfg.get("n_kv_heads") or n_heads, mlp_hidden=mlp, vocab_size=vocab,
        embedding_size=cfg.get("embedding_size") or vocab, rope_theta=float(cfg.get("rope_theta", 10000.0)),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-5)), max_len=cfg.get("max_sequence_length", 4096),
        mask_id=cfg.get("mask_token_id", 126336), eos_id=cfg.get("eos_token_id", 126081),
        tie_embeddings=bool(cfg.get("weight_tying", False)), qkv_bias=bool(cfg.get("include_bias", False)),
        logit_shift=0)


class LLaDABlock(Projections):
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "attn_out", "gate": "ff_proj", "up": "up_proj",
             "down": "ff_out"}

    def __init__(self, a: ModelArgs):
        super().__init__()
        kv_dim = a.num_kv_heads * a.head_dim
        self.attn_norm = RMSNorm(a.hidden, a.norm_eps)
        self.q_proj = nn.Linear(a.hidden, a.hidden, bias=a.qkv_bias)
        self.k_proj = nn.Linear(a.hidden, kv_dim, bias=a.qkv_bias)
        self.v_proj = nn.Linear(a.hidden, kv_dim, bias=a.qkv_bias)
        self.attn_out = nn.Linear(a.hidden, a.hidden, bias=a.qkv_bias)
        self.ff_norm = RMSNorm(a.hidden, a.norm_eps)
        self.ff_proj = nn.Linear(a.hidden, a.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(a.hidden, a.mlp_hidden, bias=False)
        self.ff_out = nn.Linear(a.mlp_hidden, a.hidden, bias=False)
        self.init_projections((a.num_heads, a.num_kv_heads, a.head_dim))

    def forward(self, h, cos, sin, kv: LayerKV | None, batch: AttentionBatch | DenseBatch):
        q, k, v = self.project_qkv(self.attn_norm(h), cos, sin)
        h = residual(self.attn_out(attend(q, k, v, kv, batch).flatten(1)), h)
        return residual(self.gated_mlp(self.ff_norm(h)), h)


class LLaDAModelLM(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.model = nn.Module()
        self.model.transformer = nn.ModuleDict({
            "wte": embedding(a.embedding_size, a.hidden),
            "blocks": nn.ModuleList(LLaDABlock(a) for _ in range(a.num_layers)),
            "ln_f": RMSNorm(a.hidden, a.norm_eps),
        })
        if not a.tie_embeddings:
            self.model.transformer["ff_out"] = nn.Linear(a.hidden, a.embedding_size, bias=False)
        self.rotary = Rotary(a.head_dim, a.rope_theta, a.max_len)

    def fuse_projections(self) -> None:
        t = self.model.transformer
        fuse_layers(self)
        if not self.args.tie_embeddings:     # the head without its padding rows (never sampled)
            t["ff_out"] = ServingLinear(t["ff_out"], rows=self.args.vocab_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch | DenseBatch,
                kv: list[LayerKV] | None, logits_rows: torch.Tensor) -> torch.Tensor:
        """Packed forward; logits only for `logits_rows` of the packed stream."""
        t = self.model.transformer
        h = t["wte"](input_ids)
        cos, sin = self.rotary.tables(positions, h.dtype)
        for block, layer_kv in zip(t["blocks"], kv or [None] * self.args.num_layers):
            h = block(h, cos, sin, layer_kv, batch)
        h = t["ln_f"](h[logits_rows])
        return h @ t["wte"].weight.T if self.args.tie_embeddings else t["ff_out"](h)
