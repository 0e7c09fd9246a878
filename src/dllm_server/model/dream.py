"""Dream (`DreamModel`): Qwen2 without the causal mask, QKV bias, GQA, HF parameter names.
Logits are shifted: token i is predicted from the hidden state at i-1."""
from __future__ import annotations

import torch
from torch import nn

from .args import ModelArgs
from .attention import AttentionBatch, DenseBatch, LayerKV, attend
from .layers import Projections, RMSNorm, embedding, Rotary, ServingLinear, fuse_layers, residual


def args_from_config(cfg: dict) -> ModelArgs:
    if cfg.get("rope_scaling"):
        raise ValueError(f"config: rope_scaling {cfg['rope_scaling']!r} is not supported")
    n_heads = cfg["num_attention_heads"]
    vocab = cfg["vocab_size"]
    eos = cfg.get("eos_token_id", 151643)
    return ModelArgs(
        arch="dream", hidden=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"], num_heads=n_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or n_heads, mlp_hidden=cfg["intermediate_size"],
        vocab_size=vocab, embedding_size=vocab, rope_theta=float(cfg.get("rope_theta", 1e6)),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), max_len=cfg.get("max_position_embeddings", 2048),
        mask_id=cfg.get("mask_token_id", 151666), eos_id=eos[0] if isinstance(eos, list) else eos,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), qkv_bias=True, logit_shift=1)


class DreamAttention(Projections):
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}

    def __init__(self, a: ModelArgs):
        super().__init__()
        kv_dim = a.num_kv_heads * a.head_dim
        self.q_proj = nn.Linear(a.hidden, a.hidden, bias=True)
        self.k_proj = nn.Linear(a.hidden, kv_dim, bias=True)
        self.v_proj = nn.Linear(a.hidden, kv_dim, bias=True)
        self.o_proj = nn.Linear(a.hidden, a.hidden, bias=False)
        self.init_projections((a.num_heads, a.num_kv_heads, a.head_dim))

    def forward(self, x, cos, sin, kv: LayerKV | None, batch: AttentionBatch | DenseBatch):
        q, k, v = self.project_qkv(x, cos, sin)
        return self.o_proj(attend(q, k, v, kv, batch).flatten(1))


class DreamMLP(Projections):
    names = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(a.hidden, a.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(a.hidden, a.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(a.mlp_hidden, a.hidden, bias=False)
        self.init_projections()

    def forward(self, x):
        return self.gated_mlp(x)


class DreamLayer(nn.Module):
    def __init__(self, a: ModelArgs, attention: type = DreamAttention):
        super().__init__()
        self.input_layernorm = RMSNorm(a.hidden, a.norm_eps)
        self.self_attn = attention(a)
        self.post_attention_layernorm = RMSNorm(a.hidden, a.norm_eps)
        self.mlp = DreamMLP(a)

    def forward(self, h, cos, sin, kv: LayerKV | None, batch: AttentionBatch | DenseBatch):
        h = residual(self.self_attn(self.input_layernorm(h), cos, sin, kv, batch), h)
        return residual(self.mlp(self.post_attention_layernorm(h)), h)


class DreamModel(nn.Module):
    attention: type = DreamAttention     # SDAR (model/sdar.py) swaps in its own

    def __init__(self, a: ModelArgs):
        super().__init__()
        self.args = a
        self.model = nn.Module()
        self.model.embed_tokens = embedding(a.embedding_size, a.hidden)
        self.model.layers = nn.ModuleList(DreamLayer(a, self.attention) for _ in range(a.num_layers))
        self.model.norm = RMSNorm(a.hidden, a.norm_eps)
        if not a.tie_embeddings:
            self.lm_head = nn.Linear(a.hidden, a.embedding_size, bias=False)
        self.rotary = Rotary(a.head_dim, a.rope_theta, a.max_len)

    def fuse_projections(self) -> None:
        fuse_layers(self)
        if not self.args.tie_embeddings:
            self.lm_head = ServingLinear(self.lm_head, rows=self.args.vocab_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch | DenseBatch,
                kv: list[LayerKV] | None, logits_rows: torch.Tensor) -> torch.Tensor:
        """Packed forward; logits only for `logits_rows` of the packed stream."""
        h = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.tables(positions, h.dtype)
        for layer, layer_kv in zip(self.model.layers, kv or [None] * self.args.num_layers):
            h = layer(h, cos, sin, layer_kv, batch)
        h = self.model.norm(h[logits_rows])
        return h @ self.model.embed_tokens.weight.T if self.args.tie_embeddings else self.lm_head(h)
