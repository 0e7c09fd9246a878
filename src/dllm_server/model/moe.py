"""Mixture of experts with DeepSeek-V3's group-limited sigmoid router (LLaDA2's "noaux_tc"): the router in float32,
the expert bias for selection only, token-expert pairs grouped by expert so each active expert runs one matmul pair.
Under tensor parallelism every rank holds a slice of every expert's intermediate dimension (tp.shard_model) and the
block's output, routed plus shared, is all-reduced once."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .args import MoEArgs
from .layers import Projections, ServingLinear


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
