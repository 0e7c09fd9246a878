"""One denoising step's commits over a batch whose rows each carry their own sampler and commit rule. Sampling
stays where the logits are; only the commit mask and tokens come back, in one device-to-host copy."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from . import unmask
from .canvas import transfer_counts
from .params import BlockPolicy, DecodeParams

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CommitRow:
    """One block's row of the step: its width, how it samples and how it commits."""
    width: int
    params: DecodeParams
    policy: BlockPolicy
    block_index: int
    step: int                       # forwards this block has already had (0 = its full forward)
    first_only: bool = False
    constraint: object | None = None   # structured/automaton.py RowConstraint: tokens kept completable


def fixed_count(policy: BlockPolicy, block_length: int, step: int) -> int:
    """Commits this step under the fixed-steps schedule, or -1 when the block has none."""
    if policy.steps is None:
        return -1
    schedule = transfer_counts(block_length, policy.steps)
    return schedule[min(step, len(schedule) - 1)]


CONFIDENCE_STATS = ("conf_mean", "conf_min", "conf_max", "conf_q25", "conf_q50", "conf_q75")


def confidence_summary(conf: torch.Tensor, still_masked: torch.Tensor,
                       candidates: tuple[float, ...]) -> torch.Tensor:
    """[B, 6 + C] float64: CONFIDENCE_STATS over still-masked positions, then how many clear each candidate."""
    c = torch.where(still_masked, conf, torch.full_like(conf, float("nan")))
    any_masked = still_masked.any(dim=-1, keepdim=True)
    c = torch.where(any_masked, c, torch.ones_like(c))
    q = torch.nanquantile(c, torch.tensor([0.25, 0.5, 0.75], dtype=c.dtype, device=c.device), dim=-1).T
    stats = [c.nanmean(dim=-1, keepdim=True),
             torch.where(c.isnan(), torch.full_like(c, float("inf")), c).amin(dim=-1, keepdim=True),
             torch.where(c.isnan(), torch.full_like(c, -float("inf")), c).amax(dim=-1, keepdim=True), q]
    if candidates:
        cand = torch.tensor(candidates, dtype=c.dtype, device=c.device)
        stats.append(((conf.unsqueeze(-1) >= cand) & still_masked.unsqueeze(-1)).sum(dim=1).to(c.dtype))
    return torch.cat(stats, dim=-1)


def commit_step(logits: torch.Tensor, masked: torch.Tensor, rows: list[CommitRow], mask_id: int,
                candidates: tuple[float, ...] | None = None, edits: "EditInputs | None" = None
                ) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [B, K, V], masked [B, K] -> host commit bool, tokens int64 [B, K] (+ summary with `candidates`).
    With `edits`, a commit at a filled position is a token edit (`edit_mask`)."""
    dev = logits.device
    masked = masked.to(dev)
    widths = [r.width for r in rows]
    gens = [unmask.step_generator(r.params.seed, r.block_index, r.step, dev) if r.params.needs_rng else None
            for r in rows]
    with_entropy = any(r.policy.entropy_bound is not None for r in rows)
    proposed = unmask.propose(logits, [r.params.temperature for r in rows], gens, widths, mask_id,
                              [r.params.top_p for r in rows], [r.params.top_k for r in rows],
                              [r.params.min_p for r in rows], with_entropy=with_entropy)
    tokens, conf = proposed[:2]
    for i, r in enumerate(rows):
        if r.constraint is not None:
            tokens[i], conf[i] = constrained_row(logits[i], r, gens[i], mask_id, tokens[i], conf[i])
    score = unmask.random_scores(widths, gens, logits.shape[1], [r.params.remasking == "random" for r in rows],
                                 conf)
    nan = float("nan")
    threshold = torch.tensor([r.policy.threshold for r in rows], dtype=torch.float64, device=dev)
    factor = torch.tensor([nan if r.policy.factor is None else r.policy.factor for r in rows],
                          dtype=torch.float64, device=dev)
    fixed = torch.tensor([fixed_count(r.policy, r.params.block_length, r.step) for r in rows],
                         dtype=torch.int64, device=dev)
    bound = None
    if with_entropy:
        bound = torch.tensor([nan if r.policy.entropy_bound is None else r.policy.entropy_bound for r in rows],
                             dtype=torch.float64, device=dev)
    count = unmask.commit_counts(score, masked, threshold, factor, fixed, bound, proposed[2] if with_entropy else None)
    if any(r.first_only for r in rows):
        first = torch.tensor([r.first_only for r in rows], dtype=torch.bool, device=dev)
        score, count = unmask.first_position_only(score, count, first, fixed)
    commit = unmask.select_commits(score, masked, count)
    if edits is not None:
        commit = commit | edit_mask(tokens, conf, edits, rows)
    if candidates is None:
        host = torch.stack((commit.to(torch.int64), tokens)).cpu()
        return host[0].bool(), host[1]
    summary = confidence_summary(conf, masked & ~commit, tuple(candidates))
    k = commit.shape[1]
    host = torch.cat((commit.to(torch.float64), tokens.to(torch.float64), summary), dim=1).cpu()
    return host[:, :k].bool(), host[:, k:2 * k].to(torch.int64), host[:, 2 * k:]


@dataclass(frozen=True, slots=True)
class EditInputs:
    """What token editing compares against (rows that do not edit have no editable position)."""
    current: torch.Tensor           # int64 [B, K]: the block's tokens before this step
    editable: torch.Tensor          # bool [B, K]: filled answer positions of editing rows


def edit_mask(tokens: torch.Tensor, conf: torch.Tensor, edits: EditInputs, rows: list[CommitRow]) -> torch.Tensor:
    """LLaDA2.1's edit rule: a filled answer position whose proposal differs from its token, with confidence >= the
    row's edit threshold, takes the proposal (decided on the same forward as the mask commits)."""
    dev = tokens.device
    bound = torch.tensor([2.0 if r.params.edit_threshold is None else r.params.edit_threshold for r in rows],
                         dtype=conf.dtype, device=dev)
    return edits.editable.to(dev) & (tokens != edits.current.to(dev)) & (conf >= bound.unsqueeze(-1))


def constrained_row(logits: torch.Tensor, row: CommitRow, gen: torch.Generator | None, mask_id: int,
                    tokens: torch.Tensor, conf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A constrained row's tokens (the best assignment its automaton allows, by log-probability, or by Gumbel-
    perturbed filtered log-probabilities when sampling: the noise drawn after `propose`'s from the same generator)
    and their untempered probabilities as confidence; `tokens`, `conf`: the unconstrained row, kept if no path."""
    w = row.width
    x = logits[:w].to(torch.float64)
    x[..., mask_id] = float("-inf")
    log_probs = torch.log_softmax(x, dim=-1)
    scores = log_probs
    p = row.params
    if p.temperature > 0:
        u = torch.rand(x.shape, generator=gen, dtype=torch.float64, device=x.device)
        tempered = unmask.filtered(x / p.temperature, p.top_k, p.top_p, p.min_p)
        # a token the filters removed stays possible, below every kept one: the constraint may need it
        scores = torch.where(tempered.isinf(), log_probs - 1e6, tempered) - torch.log(-torch.log(u))
    chosen = row.constraint.choose(scores)
    if chosen is None:               # unreachable while every commit keeps the canvas completable
        log.warning("structured output: no completion of this block satisfies the constraint; unconstrained")
        return tokens, conf
    chosen = chosen.to(x.device)
    chosen = torch.where(chosen < 0, tokens[:w], chosen)
    tokens, conf = tokens.clone(), conf.clone()
    tokens[:w] = chosen
    conf[:w] = log_probs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).exp()
    return tokens, conf


def committed_logprobs(logits: torch.Tensor, tokens: torch.Tensor, rows: list[CommitRow], mask_id: int
                       ) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """For each row that asks (params.logprobs not None): every position's token log-probability under the
    forward's own distribution (untempered, unfiltered, the mask id excluded: what confidence measures) and
    the top n alternatives; row -> host (float64 [K], int64 [K, n], float64 [K, n]). Only those rows' logits."""
    out = {}
    for i, r in enumerate(rows):
        if r.params.logprobs is None:
            continue
        x = logits[i].to(torch.float64)
        x[..., mask_id] = float("-inf")
        lp = torch.log_softmax(x, dim=-1)
        chosen = lp.gather(-1, tokens[i].to(lp.device).unsqueeze(-1)).squeeze(-1)
        top = lp.topk(r.params.logprobs, dim=-1) if r.params.logprobs else None
        ids = top.indices if top is not None else torch.zeros(lp.shape[0], 0, dtype=torch.int64, device=lp.device)
        vals = top.values if top is not None else torch.zeros(lp.shape[0], 0, dtype=torch.float64, device=lp.device)
        out[i] = (chosen.cpu(), ids.cpu(), vals.cpu())
    return out
