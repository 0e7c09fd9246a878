"""SDAR (`SDARForCausalLM`): dense Qwen3 served block-causal (the caller's batch carries `block_size`); no MoE variant.
Qwen3 reads `head_dim` from the config and RMS-normalises q and k per head before rotary (one head_dim weight each,
so tensor parallelism replicates them)."""
from __future__ import annotations

import torch
from torch import nn

from .args import ModelArgs
from .attention import AttentionBatch, DenseBatch, LayerKV, attend
from .dream import DreamModel
from .layers import Projections, RMSNorm, apply_rotary

# (block_size, mask_token_id) when config.json lacks them: SDAR's weights were trained at block 4 only
# (JetAstra/SDAR#1); <|MASK|> is 151669 in the Qwen3 vocabulary.
BLOCK_DEFAULTS = {"sdar": (4, 151669)}
QWEN3_HEAD_DIM = 128       # transformers' Qwen3Config default when a config has no head_dim


def args_from_config(cfg: dict) -> ModelArgs:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"config: rope scaling {rope!r} is not supported")
    if cfg.get("use_sliding_window") or "sliding_attention" in (cfg.get("layer_types") or []):
        raise ValueError("config: sliding-window attention (use_sliding_window) is not supported")
    block, mask = BLOCK_DEFAULTS["sdar"]
    n_heads = cfg["num_attention_heads"]
    vocab = cfg["vocab_size"]
    eos = cfg.get("eos_token_id", 151643)
    return ModelArgs(
        arch="sdar", hidden=cfg["hidden_size"], num_layers=cfg["num_hidden_layers"], num_heads=n_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or n_heads, mlp_hidden=cfg["intermediate_size"],
        vocab_size=vocab, embedding_size=vocab,
        rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 1e6),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), max_len=cfg.get("max_position_embeddings", 32768),
        mask_id=cfg.get("mask_token_id", mask), eos_id=eos[0] if isinstance(eos, list) else eos,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), qkv_bias=bool(cfg.get("attention_bias", False)),
        logit_shift=0, explicit_head_dim=int(cfg.get("head_dim") or QWEN3_HEAD_DIM),
        block_size=int(cfg.get("block_size") or block))


class SDARAttention(Projections):
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}

    def __init__(self, a: ModelArgs):
        super().__init__()
        d = a.head_dim
        self.q_proj = nn.Linear(a.hidden, a.num_heads * d, bias=a.qkv_bias)
        self.k_proj = nn.Linear(a.hidden, a.num_kv_heads * d, bias=a.qkv_bias)
        self.v_proj = nn.Linear(a.hidden, a.num_kv_heads * d, bias=a.qkv_bias)
        self.o_proj = nn.Linear(a.num_heads * d, a.hidden, bias=a.qkv_bias)
        self.q_norm = RMSNorm(d, a.norm_eps)
        self.k_norm = RMSNorm(d, a.norm_eps)
        self.init_projections((a.num_heads, a.num_kv_heads, d))

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projections.project_qkv with Qwen3's per-head q/k norm between projection and rotary."""
        n_h, n_kv, d = self.shape
        if self.qkv is None:
            q = self.q_proj(x).view(-1, n_h, d)
            k = self.k_proj(x).view(-1, n_kv, d)
            v = self.v_proj(x).view(-1, n_kv, d)
        else:
            y = self.qkv(x).view(-1, n_h + 2 * n_kv, d)
            q, k, v = y[:, :n_h], y[:, n_h: n_h + n_kv], y[:, n_h + n_kv:]
        return apply_rotary(self.q_norm(q), cos, sin), apply_rotary(self.k_norm(k), cos, sin), v

    def forward(self, x, cos, sin, kv: LayerKV | None, batch: AttentionBatch | DenseBatch):
        q, k, v = self.project_qkv(x, cos, sin)
        return self.o_proj(attend(q, k, v, kv, batch).flatten(1))


class SDARForCausalLM(DreamModel):
    """Dream's Qwen-layout skeleton with Qwen3's attention; no logit shift (args_from_config sets it)."""
    attention = SDARAttention
