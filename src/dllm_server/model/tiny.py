"""Seeded tiny checkpoints in the real HF layout, with a byte-level tokenizer (256 bytes + the family's specials):
no training needed and any text round-trips. Used by tests, benchmarks and the demo model's trainer."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from ..checkpoint import MODEL_TYPES, bytes_to_unicode, with_token_ids
from .loader import ARCHITECTURES

LLADA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
DREAM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant."
    "<|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Qwen3's ChatML without its thinking blocks and tools (SDAR chat models use Qwen3's tokenizer).
# Ling's chat format, which LLaDA2's tokenizer uses: roles in capitals, each turn closed by <|role_end|>.
LLADA2_TEMPLATE = (
    "{% set names = {'user': 'HUMAN', 'assistant': 'ASSISTANT', 'system': 'SYSTEM'} %}"
    "{% for message in messages %}<role>{{ names.get(message['role'], message['role'] | upper) }}</role>"
    "{{ message['content'] }}<|role_end|>{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}")
SDAR_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# Special tokens follow the real families' strings; ids start right after the 256 bytes.
SPECIALS = {
    "llada": ["<|endoftext|>", "<|startoftext|>", "<|start_header_id|>", "<|end_header_id|>",
              "<|eot_id|>", "<|mdm_mask|>"],
    "dream": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>", "<|beginoftext|>"],
    "sdar": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"],
    "llada2": ["<|endoftext|>", "<role>", "</role>", "<|role_end|>", "<|mask|>"],
}


def byte_tokenizer(specials: list[str]) -> Tokenizer:
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok


def write_tokenizer(out: Path, family: str, max_len: int) -> dict[str, int]:
    specials = SPECIALS[family]
    tok = byte_tokenizer(specials)
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in specials}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(family, max_len), indent=2))
    return ids


def tokenizer_config(family: str, max_len: int) -> dict:
    if family == "llada":
        cfg = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "mask_token": "<|mdm_mask|>", "chat_template": LLADA_TEMPLATE}
    elif family == "llada2":          # no BOS; the mask token named here only (config.json has no mask_token_id)
        cfg = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "mask_token": "<|mask|>", "chat_template": LLADA2_TEMPLATE}
    elif family == "sdar":            # Qwen3: no BOS token
        cfg = {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "mask_token": "<|MASK|>", "chat_template": SDAR_TEMPLATE}
    else:
        cfg = {"bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "mask_token": "<|mask|>", "chat_template": DREAM_TEMPLATE}
    cfg.update({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
                "clean_up_tokenization_spaces": False, "add_bos_token": False})
    return cfg


def llada2_config(ids: dict[str, int], hidden: int, layers: int, heads: int, kv_heads: int, mlp: int, max_len: int,
                  vocab: int, dtype: str, head_dim: int, experts: int, experts_per_token: int, groups: int) -> dict:
    """LLaDA2.x's config.json keys; the first layer dense, one shared expert, half-width rotary, QK norm."""
    eos = ids["<|endoftext|>"]
    return {"architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe", "hidden_size": hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim or hidden // heads, "intermediate_size": mlp, "moe_intermediate_size": mlp // 4,
            "num_experts": experts, "num_experts_per_tok": experts_per_token, "num_shared_experts": 1,
            "first_k_dense_replace": 1, "n_group": groups, "topk_group": max(1, groups // 2),
            "routed_scaling_factor": 2.5, "score_function": "sigmoid", "moe_router_enable_expert_bias": True,
            "norm_topk_prob": True, "use_qk_norm": True, "use_qkv_bias": False, "use_bias": False,
            "partial_rotary_factor": 0.5, "rope_theta": 600000.0, "rope_scaling": None, "rms_norm_eps": 1e-6,
            "max_position_embeddings": max_len, "vocab_size": vocab, "tie_word_embeddings": False,
            "hidden_act": "silu", "eos_token_id": eos, "pad_token_id": eos, "torch_dtype": dtype}


def tiny_config(family: str, ids: dict[str, int], hidden: int, layers: int, heads: int, kv_heads: int,
                mlp: int, max_len: int, vocab: int, dtype: str, head_dim: int = 0, block_size: int = 4) -> dict:
    padded = -(-vocab // 64) * 64
    if family == "sdar":
        eos = ids["<|endoftext|>"]
        return {"architectures": ["SDARForCausalLM"], "model_type": "sdar", "hidden_size": hidden,
                "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                "head_dim": head_dim or hidden // heads, "intermediate_size": mlp, "vocab_size": vocab,
                "rope_theta": 1000000.0, "rope_scaling": None, "rms_norm_eps": 1e-6,
                "max_position_embeddings": max_len, "tie_word_embeddings": False, "attention_bias": False,
                "attention_dropout": 0.0, "hidden_act": "silu", "use_sliding_window": False,
                "sliding_window": None, "max_window_layers": layers, "block_size": block_size,
                "mask_token_id": ids["<|MASK|>"], "eos_token_id": eos, "bos_token_id": eos,
                "pad_token_id": eos, "torch_dtype": dtype}
    if family == "llada":
        return {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": hidden,
                "n_layers": layers, "n_heads": heads, "n_kv_heads": kv_heads, "mlp_hidden_size": mlp,
                "vocab_size": vocab, "embedding_size": padded, "rope_theta": 500000.0,
                "rms_norm_eps": 1e-5, "max_sequence_length": max_len, "include_bias": False,
                "weight_tying": False, "activation_type": "silu", "block_type": "llama",
                "mask_token_id": ids["<|mdm_mask|>"], "eos_token_id": ids["<|endoftext|>"],
                "pad_token_id": ids["<|endoftext|>"], "torch_dtype": dtype}
    return {"architectures": ["DreamModel"], "model_type": "Dream", "hidden_size": hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "intermediate_size": mlp, "vocab_size": vocab, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "max_position_embeddings": max_len, "tie_word_embeddings": False, "hidden_act": "silu",
            "mask_token_id": ids["<|mask|>"], "eos_token_id": ids["<|endoftext|>"],
            "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|beginoftext|>"], "torch_dtype": dtype}


def init_weights(model: torch.nn.Module, seed: int, logit_scale: float = 5.0, norm_jitter: float = 0.0) -> None:
    """Seeded init with peaked outputs, so confident parallel commits happen; `norm_jitter` > 0 draws norm weights
    around 1, so an oracle sees a norm applied in the wrong place."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        if name.endswith("norm.weight") or name.endswith("ln_f.weight") or "layernorm" in name:
            if norm_jitter:
                p.data.normal_(1.0, norm_jitter, generator=g)
            else:
                p.data.fill_(1.0)
        elif name.endswith("bias"):
            p.data.normal_(0.0, 0.02, generator=g)
        elif "wte" in name or "embed_tokens" in name or "word_embeddings" in name:
            p.data.normal_(0.0, 1.0, generator=g)
        elif name.endswith("lm_head.weight") or name == "model.transformer.ff_out.weight":
            p.data.normal_(0.0, logit_scale / p.shape[1] ** 0.5, generator=g)
        else:
            p.data.normal_(0.0, 1.0 / p.shape[1] ** 0.5, generator=g)


def make_tiny_model(out: str | Path, arch: str = "llada", seed: int = 0, hidden: int = 64,
                    layers: int = 2, heads: int = 4, kv_heads: int | None = None, mlp: int = 128,
                    max_len: int = 1024, dtype: str = "float32", shards: int = 1, head_dim: int = 0,
                    block_size: int = 4, experts: int = 8, experts_per_token: int = 2, expert_groups: int = 4) -> Path:
    """`head_dim` (0: hidden // heads) applies to sdar and llada2, `block_size` to sdar (llada2's is 32, as released),
    the expert counts to llada2 (its experts' width is mlp // 4)."""
    family = arch.lower()
    if family not in SPECIALS:
        raise ValueError(f"arch: must be one of {sorted(SPECIALS)}, got {arch!r}")
    if head_dim and family not in ("sdar", "llada2"):
        raise ValueError(f"head_dim: only sdar and llada2 checkpoints set it (hidden // heads for {family})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out, family, max_len)
    vocab = 256 + len(ids)
    kv_heads = kv_heads or (heads if family == "llada" else max(1, heads // 2))
    if family == "llada2":
        cfg = llada2_config(ids, hidden, layers, heads, kv_heads, mlp, max_len, vocab, dtype, head_dim, experts,
                            experts_per_token, expert_groups)
    else:
        cfg = tiny_config(family, ids, hidden, layers, heads, kv_heads, mlp, max_len, vocab, dtype, head_dim,
                          block_size)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}))
    make_args, cls = ARCHITECTURES[MODEL_TYPES[family]]
    model = cls(make_args(with_token_ids(cfg, out)))
    init_weights(model, seed, norm_jitter=0.1 if family in ("sdar", "llada2") else 0.0)
    save_weights(model, out, getattr(torch, dtype), shards)
    return out


def save_weights(model: torch.nn.Module, out: Path, dtype: torch.dtype, shards: int = 1) -> None:
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if shards <= 1:
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k] for k in part}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
