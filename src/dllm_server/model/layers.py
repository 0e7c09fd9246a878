"""Shared layers: RMSNorm, rotate-half rotary, SwiGLU, and serving-only fusion of Q|K|V and gate|up into single matmuls.
Keys are cached after rotation: equivalent to Fast-dLLM's pre-rotary cache, as rotation depends only on position."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def embedding(num: int, dim: int) -> nn.Embedding:
    """A token embedding left uninitialised: the checkpoint replaces it, and its random init on the meta device goes
    through a torch reference that imports torch._dynamo (68 MB resident in every rank; docs/parallelism.md)."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:   # one kernel, same bits
            return F.rms_norm(x, (x.shape[-1],), self.weight, eps=self.eps)
        # float32 like the reference implementations
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (y * self.weight.float()).to(x.dtype)


class Rotary(nn.Module):
    """cos/sin tables for every position up to max_len, computed once in float32."""

    def __init__(self, head_dim: int, theta: float, max_len: int):
        super().__init__()
        if torch.get_default_device().type == "meta":     # a model built to be loaded: the loader makes the tables
            for name in ("cos", "sin"):                   # (torch's arange on meta imports torch._dynamo, as above)
                self.register_buffer(name, torch.empty(max_len, head_dim), persistent=False)
            return
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        # rotate_half's sign folded into the table: (-x2) * s == x2 * (-s) exactly
        sin = emb.sin().float()
        self.register_buffer("sin", torch.cat([-sin[:, : head_dim // 2], sin[:, head_dim // 2:]], -1),
                             persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def residual(y: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """h + y, in place on the fresh y when dtypes match; else out of place in h's wider dtype (bf16 autocast)."""
    return y.add_(h) if y.dtype == h.dtype else h + y


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; `sin` carries rotate_half's sign (Rotary.tables). Tables narrower than the head rotate
    its first dims only and pass the rest (partial rotary)."""
    if cos.shape[-1] < x.shape[-1]:
        r = cos.shape[-1]
        return torch.cat([apply_rotary(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return rotated.mul_(sin).add_(x * cos)


class ServingLinear(nn.Module):
    """Linears side by side as x @ W^T, W^T contiguous (faster at block-step rows: docs/benchmarks.md §8). `fixed_rows`
    > 0 runs every call as matmuls of exactly that many rows, forcing batch invariance (worker/determinism.py)."""

    def __init__(self, *linears: nn.Linear, rows: int | None = None):
        super().__init__()
        w = torch.cat([m.weight for m in linears])[:rows]
        self.weight_t = nn.Parameter(w.t().contiguous(), requires_grad=False)
        self.bias = (None if linears[0].bias is None else
                     nn.Parameter(torch.cat([m.bias for m in linears])[:rows], requires_grad=False))
        self.fixed_rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed_rows and x.shape[0] != self.fixed_rows:
            return self._fixed(x)
        return torch.mm(x, self.weight_t) if self.bias is None else torch.addmm(self.bias, x, self.weight_t)

    def _fixed(self, x: torch.Tensor) -> torch.Tensor:
        c, n = self.fixed_rows, x.shape[0]
        if n % c:
            x = torch.cat([x, x.new_zeros(c - n % c, x.shape[1])])
        out = x.new_empty(x.shape[0], self.weight_t.shape[1])
        for i in range(0, x.shape[0], c):
            if self.bias is None:
                torch.mm(x[i:i + c], self.weight_t, out=out[i:i + c])
            else:
                torch.addmm(self.bias, x[i:i + c], self.weight_t, out=out[i:i + c])
        return out[:n]


class ReducedLinear(ServingLinear):
    """A tensor-parallel rank's input columns of a projection: partial product all-reduced in place, then the bias."""

    def __init__(self, linear: nn.Linear, reduce):
        super().__init__(linear)
        self.out_bias, self.bias = self.bias, None
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x)
        self.reduce(y)
        return y if self.out_bias is None else y.add_(self.out_bias)


class Projections(nn.Module):
    """Q/K/V with rotary and the gated MLP of a layer; `names` maps roles (q, k, v or a checkpoint's fused qkv, o, gate,
    up, down) to attributes. `sums_ranks` False: a part of a block that all-reduces once for all (moe.SparseMoE)."""
    names: dict[str, str] = {}
    sums_ranks = True

    def init_projections(self, shape: tuple[int, int, int] | None = None) -> None:
        self.shape = shape            # (heads, kv heads, head dim): layers with q/k/v only
        self.reduce = None            # tensor parallel: the all-reduce after o / down
        self.qkv: ServingLinear | None = None
        self.gate_up: ServingLinear | None = None

    def fuse(self) -> None:
        n = self.names
        if "q" in n:
            self.qkv = ServingLinear(*(getattr(self, n[r]) for r in "qkv"))
        elif "qkv" in n:
            self.qkv = ServingLinear(getattr(self, n["qkv"]))
        if "gate" in n:
            self.gate_up = ServingLinear(getattr(self, n["gate"]), getattr(self, n["up"]))
        for role in ("q", "k", "v", "qkv", "gate", "up"):
            if role in n:
                delattr(self, n[role])
        for role in ("o", "down"):
            if role in n:
                lin = getattr(self, n[role])
                setattr(self, n[role], ServingLinear(lin) if self.reduce is None else ReducedLinear(lin, self.reduce))

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, D] and k [T, Hkv, D] rotated, v [T, Hkv, D] (views of one buffer when fused)."""
        n_h, n_kv, d = self.shape
        if self.qkv is None:
            n = self.names
            q = apply_rotary(getattr(self, n["q"])(x).view(-1, n_h, d), cos, sin)
            k = apply_rotary(getattr(self, n["k"])(x).view(-1, n_kv, d), cos, sin)
            return q, k, getattr(self, n["v"])(x).view(-1, n_kv, d)
        y = self.qkv(x).view(-1, n_h + 2 * n_kv, d)
        qk = apply_rotary(y[:, : n_h + n_kv], cos, sin)
        return qk[:, :n_h], qk[:, n_h:], y[:, n_h + n_kv:]

    def gated_mlp(self, x: torch.Tensor) -> torch.Tensor:
        n = self.names
        if self.gate_up is None:
            gate, up = getattr(self, n["gate"])(x), getattr(self, n["up"])(x)
        else:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        return getattr(self, n["down"])(F.silu(gate).mul_(up))


def fuse_layers(model: nn.Module) -> None:
    """Fuse every layer's projections; the caller handles its head."""
    for m in list(model.modules()):
        if isinstance(m, Projections):
            m.fuse()
