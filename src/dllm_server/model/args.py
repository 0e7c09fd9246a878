"""Architecture-neutral model arguments, parsed from each family's HF config keys."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MoEArgs:
    """A mixture-of-experts MLP with DeepSeek-V3's group-limited sigmoid routing (LLaDA2's "noaux_tc")."""
    num_experts: int
    top_k: int
    expert_hidden: int        # each routed expert's intermediate size
    num_shared: int           # shared experts, run as one MLP of num_shared * expert_hidden
    first_dense: int          # the first layers keep a dense MLP of ModelArgs.mlp_hidden
    n_group: int
    topk_group: int
    routed_scaling: float
    norm_topk: bool
    expert_bias: bool         # the router has a selection-only bias per expert

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"config: num_experts_per_tok {self.top_k} is not in 1..num_experts {self.num_experts}")
        if self.n_group < 1 or self.num_experts % self.n_group or self.num_experts // self.n_group < 2:
            raise ValueError(f"config: n_group {self.n_group} does not split {self.num_experts} experts into "
                             "groups of at least 2")
        if not 0 < self.topk_group <= self.n_group or self.topk_group * self.num_experts // self.n_group < self.top_k:
            raise ValueError(f"config: topk_group {self.topk_group} groups cannot hold num_experts_per_tok "
                             f"{self.top_k} experts")


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
    rotary_dim: int = 0       # > 0: rotary on the first rotary_dim dims of each head only (LLaDA2)
    qk_norm: bool = False     # RMSNorm per head on queries and keys (LLaDA2; SDAR's attention always has it)
    out_bias: bool = False    # the attention output projection has a bias (LLaDA2's use_bias)
    moe: MoEArgs | None = None

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

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
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(f"config: rotary dimension {self.rotary_dim} is odd or above head_dim {self.head_dim}")
        if self.block_size < 0:
            raise ValueError(f"config: block_size {self.block_size} is negative")
