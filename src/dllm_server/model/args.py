"""Architecture-neutral model arguments, parsed from each family's HF config keys."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelArgs:
    arch: str
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    mlp_hidden: int
    vocab_size: int           # tokens that may be sampled
    embedding_size: int       # rows of the embedding / LM head (>= vocab_size)
    rope_theta: float
    norm_eps: float
    max_len: int
    mask_id: int
    eos_id: int
    tie_embeddings: bool
    qkv_bias: bool
    logit_shift: int          # 0: logits[i] predicts token i (LLaDA); 1: token i from i-1 (Dream)
    tp_size: int = 1
    explicit_head_dim: int = 0
    block_size: int = 0       # > 0: block-causal attention on blocks of this width from position 0 (SDAR)

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.num_heads

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def local_kv_heads(self) -> int:
        return self.num_kv_heads // self.tp_size

    def __post_init__(self) -> None:
        if not self.explicit_head_dim and self.hidden % self.num_heads:
            raise ValueError(f"config: hidden size {self.hidden} is not divisible by {self.num_heads} heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"config: {self.num_heads} heads are not a multiple of {self.num_kv_heads} KV heads")
        if self.num_heads % self.tp_size or self.num_kv_heads % self.tp_size:
            raise ValueError(f"tensor_parallel_size: {self.tp_size} does not divide the model's {self.num_heads} "
                             f"attention heads and {self.num_kv_heads} KV heads")
        if not 0 <= self.mask_id < self.embedding_size:
            raise ValueError(f"config: mask_token_id {self.mask_id} is outside the vocabulary")
        if self.block_size < 0:
            raise ValueError(f"config: block_size {self.block_size} is negative")
