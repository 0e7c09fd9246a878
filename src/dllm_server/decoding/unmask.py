"""Tensor functions of one denoising step: rows are requests, columns their block's positions (padding never masked).
float64 as in Fast-dLLM; randomness only from per-request (seed, block, step) generators, never from the batch."""
from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def step_generator(seed: int, block_index: int, step: int,
                   device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from (seed, block, step) alone; CPU and CUDA streams differ."""
    x = (seed * 0x9E3779B97F4A7C15 + block_index * 0xBF58476D1CE4E5B9 + step * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    x = (x * 0xD6E8FEB86659FD93) & _MASK64
    x ^= x >> 32
    return torch.Generator(device=device).manual_seed(x & ((1 << 63) - 1))


def top_k_filter(x: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the `top_k` highest logits (0: all); ties with the k-th stay, so sort order never matters."""
    if top_k <= 0 or top_k >= x.shape[-1]:
        return x
    kth = x.topk(top_k, dim=-1).values[..., -1:]
    return x.masked_fill(x < kth, float("-inf"))


def top_p_filter(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p (at least one)."""
    probs = torch.softmax(x, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))


def min_p_filter(x: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep the tokens whose probability is at least `min_p` times the most likely one's."""
    probs = torch.softmax(x, dim=-1)
    return x.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))


def filtered(tempered: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The sampling filters in Hugging Face's order (after temperature): top-k, top-p, min-p."""
    if top_k > 0:
        tempered = top_k_filter(tempered, top_k)
    if top_p < 1.0:
        tempered = top_p_filter(tempered, top_p)
    if min_p > 0.0:
        tempered = min_p_filter(tempered, min_p)
    return tempered


def propose(logits: torch.Tensor, temperature: list[float], generators: list[torch.Generator | None],
            widths: list[int], banned_id: int, top_p: list[float] | None = None,
            top_k: list[int] | None = None, min_p: list[float] | None = None,
            chunk_elements: int = 1 << 25, with_entropy: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token and confidence per position of logits [B, K, V]: argmax, or float64 Gumbel-max over filtered tempered
    logits (noise for `widths[b]` positions). Confidence is the untempered, unfiltered probability (LLaDA), so commit
    rules mean the same under any sampler. Chunking bounds memory, not results. `with_entropy`: also entropy (nats)."""
    b_total, k, v = logits.shape
    tokens = torch.empty(b_total, k, dtype=torch.int64, device=logits.device)
    confidence = torch.empty(b_total, k, dtype=torch.float64, device=logits.device)
    entropy = torch.empty(b_total, k, dtype=torch.float64, device=logits.device) if with_entropy else None
    step = max(1, chunk_elements // max(1, k * v))
    for lo in range(0, b_total, step):
        hi = min(b_total, lo + step)
        x = logits[lo:hi].to(torch.float64)
        x[..., banned_id] = float("-inf")
        log_probs = torch.log_softmax(x, dim=-1)
        tok = x.argmax(dim=-1)
        for b in range(lo, hi):
            temp = temperature[b]
            if temp > 0:
                w = widths[b]
                u = torch.rand((w, v), generator=generators[b], dtype=torch.float64, device=x.device)
                gumbel = -torch.log(-torch.log(u))
                tempered = filtered(x[b - lo, :w] / temp, top_k[b] if top_k else 0, top_p[b] if top_p else 1.0,
                                    min_p[b] if min_p else 0.0)
                tok[b - lo, :w] = (tempered + gumbel).argmax(dim=-1)
        tokens[lo:hi] = tok
        confidence[lo:hi] = log_probs.gather(-1, tok.unsqueeze(-1)).squeeze(-1).exp()
        if entropy is not None:
            entropy[lo:hi] = torch.special.entr(log_probs.exp()).sum(dim=-1)   # entr(0) = 0: the banned id
    return (tokens, confidence) if entropy is None else (tokens, confidence, entropy)


def commit_counts(score: torch.Tensor, masked: torch.Tensor, threshold: torch.Tensor,
                  factor: torch.Tensor, fixed: torch.Tensor, entropy_bound: torch.Tensor | None = None,
                  entropy: torch.Tensor | None = None) -> torch.Tensor:
    """Commits per row (>= 1 while any is masked): `fixed[b] >= 0`, else `factor[b]`, else `entropy_bound[b]` (NaN:
    unset), else `threshold[b]`. The factor rule takes its longest passing prefix, without Fast-dLLM's off-by-one."""
    s = torch.where(masked, score, torch.full_like(score, float("-inf")))
    ranked, _ = torch.sort(s, dim=-1, descending=True)
    num_masked = masked.sum(dim=-1)
    by_threshold = (ranked >= threshold.unsqueeze(-1)).sum(dim=-1)
    n = torch.arange(1, s.shape[-1] + 1, dtype=torch.float64, device=s.device)
    passes = ranked >= 1.0 - factor.unsqueeze(-1) / (n + 1)
    by_factor = passes.to(torch.int64).cumprod(dim=-1).sum(dim=-1)
    count = by_threshold
    if entropy_bound is not None:
        count = torch.where(entropy_bound.isnan(), count, entropy_bounded_counts(score, entropy, masked,
                                                                                 entropy_bound.nan_to_num(0.0)))
    count = torch.where(factor.isnan(), count, by_factor)
    count = torch.where(fixed >= 0, fixed, count)
    count = torch.maximum(count, torch.ones_like(count))
    return torch.minimum(count, num_masked)


def entropy_bounded_counts(score: torch.Tensor, entropy: torch.Tensor, masked: torch.Tensor,
                           bound: torch.Tensor) -> torch.Tensor:
    """EB-sampler (arXiv 2505.24857): the longest best-first prefix whose entropies, less the largest, sum <= bound."""
    s = torch.where(masked, score, torch.full_like(score, float("-inf")))
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices
    h = torch.where(masked, entropy, torch.zeros_like(entropy)).gather(-1, order)
    excess = h.cumsum(dim=-1) - h.cummax(dim=-1).values
    count = (excess <= bound.unsqueeze(-1)).to(torch.int64).cumprod(dim=-1).sum(dim=-1)
    return torch.minimum(torch.clamp(count, min=1), masked.sum(dim=-1))


def first_position_only(score: torch.Tensor, count: torch.Tensor, first_only: torch.Tensor,
                        fixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast-dLLM's Dream rule at a full forward: the block's first position commits (cached steps cannot predict it)."""
    lead = torch.zeros_like(score, dtype=torch.bool)
    lead[:, 0] = True
    score = torch.where(first_only.unsqueeze(-1) & lead, torch.full_like(score, float("inf")), score)
    count = torch.where(first_only & (fixed < 0), torch.ones_like(count), count)
    return score, count


def select_commits(score: torch.Tensor, masked: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Boolean [B, K]: the `count[b]` best-scoring masked positions per row; ties go to the lower position."""
    s = torch.where(masked, score, torch.full_like(score, float("-inf")))
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(s.shape[-1], device=s.device).expand_as(order).contiguous())
    return masked & (rank < count.unsqueeze(-1))


def random_scores(widths: list[int], generators: list[torch.Generator | None], k: int,
                  use_random: list[bool], confidence: torch.Tensor) -> torch.Tensor:
    """LLaDA's `random` remasking: rows that ask for it rank positions by i.i.d. uniforms."""
    if not any(use_random):
        return confidence
    score = confidence.clone()
    for b, flag in enumerate(use_random):
        if flag:
            w = widths[b]
            score[b, :w] = torch.rand(w, generator=generators[b], dtype=torch.float64, device=score.device)
    return score
