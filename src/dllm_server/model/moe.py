"""Mixture of experts with DeepSeek-V3's group-limited sigmoid router (LLaDA2's "noaux_tc"): the router in float32,
the expert bias for selection only, token-expert pairs grouped by expert so each active expert runs one matmul pair.
Under tensor parallelism every rank holds a slice of every expert's intermediate dimension (tp.shard_model) and the
block's output, routed plus shared, is all-reduced once."""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from .args import MoEArgs
from .layers import Projections, ServingLinear

log = logging.getLogger(__name__)


class GatedMLP(Projections):
    """SwiGLU MLP with Hugging Face's gate_proj / up_proj / down_proj names: dense layers, experts, shared experts."""
    names = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}

    def __init__(self, hidden: int, inner: int, sums_ranks: bool = True):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.init_projections()
        self.sums_ranks = sums_ranks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gated_mlp(x)


def route(logits: torch.Tensor, expert_bias: torch.Tensor | None, m: MoEArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 router logits [T, E] -> (expert ids [T, k], weights [T, k] float32). Groups are ranked by the sum of
    their two best biased scores, the top-k experts taken from the kept groups; weights are the unbiased scores."""
    scores = logits.sigmoid()
    choice = scores if expert_bias is None else scores + expert_bias.float()
    t, e = choice.shape
    group_score = choice.view(t, m.n_group, -1).topk(2, dim=-1).values.sum(dim=-1)
    kept = group_score.topk(m.topk_group, dim=-1, sorted=False).indices
    in_kept = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
    choice = choice.masked_fill(~in_kept.repeat_interleave(e // m.n_group, dim=1), float("-inf"))
    ids = choice.topk(m.top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if m.norm_topk:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * m.routed_scaling


class MoEGate(nn.Module):
    """The router: `weight` [E, hidden] and, when the checkpoint has one, `expert_bias` [E] (names as LLaDA2's)."""

    def __init__(self, hidden: int, num_experts: int, expert_bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.expert_bias = nn.Parameter(torch.zeros(num_experts)) if expert_bias else None
        self.serving: ServingLinear | None = None

    def fuse(self) -> None:
        """A float32 copy of the weight as a ServingLinear, so the router follows the batch-invariance setting."""
        w = self.weight.detach().float()
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=torch.float32)
        lin.weight.data = w
        self.serving = ServingLinear(lin)
        del self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return self.serving(x) if self.serving is not None else F.linear(x, self.weight.float())


class SparseMoE(nn.Module):
    sums_ranks = True

    def __init__(self, hidden: int, m: MoEArgs):
        super().__init__()
        self.moe = m
        self.gate = MoEGate(hidden, m.num_experts, m.expert_bias)
        self.experts = nn.ModuleList(GatedMLP(hidden, m.expert_hidden, sums_ranks=False)
                                     for _ in range(m.num_experts))
        self.shared_experts = (GatedMLP(hidden, m.expert_hidden * m.num_shared, sums_ranks=False)
                               if m.num_shared else None)
        self.reduce = None            # tensor parallel: the all-reduce of the block's output
        self.fused: FusedExperts | None = None   # a fused kernel in place of the experts (use_fused_experts)

    def fuse(self) -> None:
        self.gate.fuse()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = route(self.gate(x), self.gate.expert_bias, self.moe)
        y = self.routed(x, ids, weights)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        y = y.to(x.dtype)
        if self.reduce is not None:
            self.reduce(y)
        return y

    def routed(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Sum over each token's k experts of weight * expert(token), in the weights' (wider) dtype; the pairs are
        sorted by expert (stable), each active expert's rows one contiguous slice."""
        if self.fused is not None:
            return self.fused(x, ids, weights)
        t, k = ids.shape
        flat = ids.flatten()
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.moe.num_experts).tolist()
        rows = x.index_select(0, order // k)
        out = torch.empty_like(rows)
        start = 0
        for expert, n in enumerate(counts):
            if n:
                out[start:start + n] = self.experts[expert](rows[start:start + n])
                start += n
        pairs = torch.empty_like(out).index_copy_(0, order, out)
        return (pairs.view(t, k, -1) * weights.unsqueeze(-1)).sum(dim=1)


class FusedExperts:
    """A fused MoE kernel over one layer's experts, FlashInfer's CUTLASS `cutlass_fused_moe` signature: (x [T, H],
    expert ids [T, k] int32, weights [T, k] float32, fc1 [E, 2I, H], fc2 [E, H, I], output dtype, quant_scales)
    -> [T, H]. `up_first`: fc1's halves as [up; gate] (the order the self-check found)."""

    def __init__(self, kernel, experts: nn.ModuleList, up_first: bool):
        def fc1(e: GatedMLP) -> torch.Tensor:
            w = e.gate_up.weight_t.t()                     # [2I, H]: gate rows, then up rows
            gate, up = w.chunk(2, dim=0)
            return torch.cat((up, gate) if up_first else (gate, up))
        self.kernel, self.up_first = kernel, up_first
        self.fc1 = torch.stack([fc1(e) for e in experts]).contiguous()
        self.fc2 = torch.stack([e.down_proj.weight_t.t() for e in experts]).contiguous()

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = self.kernel(x.contiguous(), ids.to(torch.int32), weights.float(), self.fc1, self.fc2, x.dtype,
                          quant_scales=[])
        return out[0] if isinstance(out, (list, tuple)) else out


def flashinfer_kernel():
    """FlashInfer's CUTLASS fused MoE, or None where it is not installed."""
    try:
        from flashinfer.fused_moe import cutlass_fused_moe
    except Exception:                          # not installed, or built without it
        return None
    return cutlass_fused_moe


def use_fused_experts(model: nn.Module, kernel, tolerance: float = 2e-2, tokens: int = 64) -> int:
    """Puts `kernel` in place of each MoE layer's grouped experts where it computes what they compute, checked per
    layer on seeded random tokens against the torch path (both fc1 orders tried); a layer that disagrees keeps the
    torch path. A fused layer's torch experts are released at once (one layer's copy at a time). Returns the number
    of layers fused."""
    fused = 0
    for layer in [m for m in model.modules() if isinstance(m, SparseMoE)]:
        w = layer.experts[0].gate_up.weight_t                       # [H, 2I]
        gen = torch.Generator(w.device).manual_seed(fused)
        x = torch.randn(tokens, w.shape[0], device=w.device, dtype=w.dtype, generator=gen) * 0.5
        ids, weights = route(layer.gate(x), layer.gate.expert_bias, layer.moe)
        want = layer.routed(x, ids, weights).float()
        for up_first in (False, True):
            try:
                candidate = FusedExperts(kernel, layer.experts, up_first)
                got = candidate(x, ids, weights).float()
            except Exception as exc:           # an unsupported dtype, shape or device: the torch path everywhere
                log.info("fused MoE kernel not used: %s: %s", type(exc).__name__, exc)
                return fused
            if got.shape == want.shape and float((got - want).norm() / want.norm().clamp_min(1e-12)) <= tolerance:
                layer.fused, layer.experts = candidate, None
                fused += 1
                break
        else:
            log.warning("fused MoE kernel disagrees with a layer's torch experts there; that layer keeps them")
    return fused
