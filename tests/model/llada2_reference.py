"""An independent no-cache LLaDA2 (`LLaDA2MoeModelLM`) for the oracles, built from stock parts and nothing of
dllm_server: transformers' DeepSeek-V3 MoE (its group-limited sigmoid router, the checkpoint's expert bias as
`e_score_correction_bias`), its dense MLP and RMSNorm, plain PyTorch attention under an explicit additive 4-D mask,
and the remote modeling code's partial rotary (rotate-half on the first head_dim * partial_rotary_factor dims) written
out here. Weights are read from the checkpoint folder's safetensors by their Hugging Face names.

`ReferenceLLaDA2(folder, dtype)(input_ids=[1, W], attention_mask=[1, 1, W, W] additive, position_ids=[1, W])`
returns an object with `.logits` [1, W, V], the shape sdar_reference's loops and diffusers' pipeline adapter expect."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file
from torch import nn


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    index = folder / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file()
             else ["model.safetensors"])
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(folder / f)))
    return out


def deepseek_config(cfg: dict):
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    return DeepseekV3Config(
        hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        moe_intermediate_size=cfg["moe_intermediate_size"], n_routed_experts=cfg["num_experts"],
        num_experts_per_tok=cfg["num_experts_per_tok"], n_group=cfg["n_group"], topk_group=cfg["topk_group"],
        n_shared_experts=cfg["num_shared_experts"], routed_scaling_factor=cfg["routed_scaling_factor"],
        norm_topk_prob=cfg.get("norm_topk_prob", True), hidden_act="silu", rms_norm_eps=cfg["rms_norm_eps"])


def stock_moe(ds_config, state: dict[str, torch.Tensor], prefix: str, num_experts: int):
    """transformers' DeepseekV3MoE holding the LLaDA2 checkpoint's tensors under `prefix` (e.g. model.layers.1.mlp.)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    moe = DeepseekV3MoE(ds_config)
    with torch.no_grad():
        moe.gate.weight.copy_(state[prefix + "gate.weight"])
        if prefix + "gate.expert_bias" in state:
            moe.gate.e_score_correction_bias.copy_(state[prefix + "gate.expert_bias"])
        for e in range(num_experts):
            ex = f"{prefix}experts.{e}."
            moe.experts.gate_up_proj[e].copy_(torch.cat([state[ex + "gate_proj.weight"], state[ex + "up_proj.weight"]]))
            moe.experts.down_proj[e].copy_(state[ex + "down_proj.weight"])
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(moe.shared_experts, name).weight.copy_(state[f"{prefix}shared_experts.{name}.weight"])
    return moe


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class ReferenceLLaDA2(nn.Module):
    def __init__(self, folder: str | Path, dtype: torch.dtype = torch.float32):
        super().__init__()
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP, DeepseekV3RMSNorm
        folder = Path(folder)
        cfg = json.loads((folder / "config.json").read_text())
        state = _weights(folder)
        ds = deepseek_config(cfg)
        self.cfg = cfg
        h, self.n_heads, self.n_kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or h // self.n_heads
        self.rot = int(self.head_dim * cfg.get("partial_rotary_factor", 1.0))
        eps = cfg["rms_norm_eps"]

        def linear(name: str, bias: bool = False) -> nn.Linear:
            w = state[name + ".weight"]
            lin = nn.Linear(w.shape[1], w.shape[0], bias=bias)
            lin.weight.data.copy_(w)
            if bias:
                lin.bias.data.copy_(state[name + ".bias"])
            return lin

        def norm(name: str, dim: int) -> nn.Module:
            n = DeepseekV3RMSNorm(dim, eps)
            n.weight.data.copy_(state[name + ".weight"])
            return n

        self.embed = nn.Embedding.from_pretrained(state["model.word_embeddings.weight"].clone())
        self.layers = nn.ModuleList()
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            layer = nn.Module()
            layer.input_norm = norm(p + "input_layernorm", h)
            layer.qkv = linear(p + "attention.query_key_value", cfg.get("use_qkv_bias", False))
            layer.q_norm = norm(p + "attention.query_layernorm", self.head_dim)
            layer.k_norm = norm(p + "attention.key_layernorm", self.head_dim)
            layer.dense = linear(p + "attention.dense", cfg.get("use_bias", False))
            layer.post_norm = norm(p + "post_attention_layernorm", h)
            if i >= cfg.get("first_k_dense_replace", 0):
                layer.mlp = stock_moe(ds, state, p + "mlp.", cfg["num_experts"])
            else:
                layer.mlp = DeepseekV3MLP(ds, intermediate_size=cfg["intermediate_size"])
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(layer.mlp, name).weight.data.copy_(state[f"{p}mlp.{name}.weight"])
            self.layers.append(layer)
        self.norm = norm("model.norm", h)
        self.lm_head = linear("lm_head")
        self.to(dtype).eval()

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def _rotary(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        inv = 1.0 / (self.cfg["rope_theta"] ** (torch.arange(0, self.rot, 2, dtype=torch.float32) / self.rot))
        freqs = positions.float()[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)    # [W, rot], broadcast over heads
        r, rest = x[..., :self.rot], x[..., self.rot:]
        return torch.cat([r * cos + _rotate_half(r) * sin, rest], dim=-1)

    def forward(self, input_ids, attention_mask, position_ids):
        with torch.no_grad():
            x = self.embed(input_ids[0])
            pos = position_ids[0]
            w, d = x.shape[0], self.head_dim
            for layer in self.layers:
                y = layer.qkv(layer.input_norm(x)).view(w, self.n_heads + 2 * self.n_kv, d).transpose(0, 1)
                q, k, v = y.split([self.n_heads, self.n_kv, self.n_kv], dim=0)
                q, k = self._rotary(layer.q_norm(q), pos), self._rotary(layer.k_norm(k), pos)
                rep = self.n_heads // self.n_kv
                k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
                scores = q @ k.transpose(1, 2) * d ** -0.5 + attention_mask[0]
                o = torch.softmax(scores, dim=-1) @ v
                x = x + layer.dense(o.transpose(0, 1).reshape(w, -1))
                x = x + layer.mlp(layer.post_norm(x)[None])[0]
            return SimpleNamespace(logits=self.lm_head(self.norm(x))[None])
