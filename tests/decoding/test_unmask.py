"""Unmasking rules as pure tensor functions."""
import math

import pytest
import torch

from dllm_server.decoding import unmask
from dllm_server.decoding.canvas import answer_len, effective_steps, steps_per_block, transfer_counts

NAN = float("nan")


def _counts(conf, masked, threshold=NAN, factor=NAN, fixed=-1):
    c = torch.tensor([conf], dtype=torch.float64)
    m = torch.tensor([masked])
    return int(unmask.commit_counts(c, m, torch.tensor([threshold if not math.isnan(threshold) else 0.9],
                                                         dtype=torch.float64),
                                    torch.tensor([factor], dtype=torch.float64), torch.tensor([fixed]))[0])


def test_threshold_commits_all_above_and_at_least_one():
    conf = [0.95, 0.2, 0.91, 0.5]
    assert _counts(conf, [True] * 4, threshold=0.9) == 2
    assert _counts(conf, [True] * 4, threshold=0.99) == 1            # always the best one
    assert _counts(conf, [True] * 4, threshold=0.0) == 4
    assert _counts(conf, [False, True, False, True], threshold=0.9) == 1   # committed positions never count


def test_raising_threshold_never_commits_more():
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(50, generator=g, dtype=torch.float64).tolist()
    counts = [_counts(conf, [True] * 50, threshold=t / 20) for t in range(21)]
    assert counts == sorted(counts, reverse=True) and counts[-1] >= 1


def test_factor_rule_longest_passing_prefix():
    # n-th best passes if c_n >= 1 - f/(n+1): with f=1: 0.5, 0.667, 0.75, 0.8 ...
    assert _counts([0.9, 0.7, 0.76, 0.1], [True] * 4, factor=1.0) == 2        # 0.7 < 1 - 1/4
    assert _counts([0.9, 0.7, 0.8, 0.1], [True] * 4, factor=1.0) == 2
    assert _counts([0.9, 0.76, 0.8, 0.1], [True] * 4, factor=1.0) == 3
    assert _counts([0.4, 0.3], [True] * 2, factor=1.0) == 1          # first always commits
    assert _counts([0.99, 0.99, 0.99, 0.79], [True] * 4, factor=1.0) == 3   # last candidate fails: exact
    counts = [_counts([0.9, 0.8, 0.7, 0.6, 0.5], [True] * 5, factor=f) for f in (0.5, 1, 2, 4)]
    assert counts == sorted(counts)


def test_fixed_counts_and_selection_is_top_k_of_masked():
    conf = torch.tensor([[0.1, 0.9, 0.5, 0.7]], dtype=torch.float64)
    masked = torch.tensor([[True, False, True, True]])
    count = torch.tensor([2])
    commit = unmask.select_commits(conf, masked, count)
    assert commit.tolist() == [[False, False, True, True]]


def test_one_hot_logits_reach_confidence_exactly_one():
    logits = torch.full((1, 1, 10), -1e4)
    logits[0, 0, 3] = 0.0
    tokens, conf = unmask.propose(logits, [0.0], [None], [1], banned_id=9)
    assert tokens.item() == 3 and conf.item() == 1.0


def test_mask_id_is_never_proposed():
    logits = torch.zeros(2, 4, 8)
    logits[..., 5] = 100.0
    tokens, _ = unmask.propose(logits, [0.0, 1.0], [None, torch.Generator().manual_seed(0)], [4, 4], banned_id=5)
    assert not (tokens == 5).any()


def test_gumbel_sampling_matches_softmax_of_tempered_logits():
    logits = torch.tensor([[[1.0, 0.0, -1.0, 0.5, 9.0]]])     # the last id is the banned mask
    temp = 0.7
    n = 4000
    counts = torch.zeros(5)
    for i in range(n):
        tok, conf = unmask.propose(logits, [temp], [unmask.step_generator(1, 0, i)], [1], banned_id=4)
        counts[tok.item()] += 1
    expected = torch.softmax(logits[0, 0, :4] / temp, -1) * n
    assert counts[4] == 0
    chi2 = float(((counts[:4] - expected) ** 2 / expected).sum())
    assert chi2 < 16.3    # chi-square, 3 degrees of freedom, p = 0.001
    # Confidence is the untempered probability of the sampled token.
    tok, conf = unmask.propose(logits, [temp], [unmask.step_generator(1, 0, 0)], [1], banned_id=4)
    assert conf.item() == pytest.approx(torch.softmax(logits[0, 0, :4].double(), -1)[tok.item()].item())


def test_step_generators_depend_only_on_coordinates():
    a = torch.rand(3, generator=unmask.step_generator(5, 2, 1))
    b = torch.rand(3, generator=unmask.step_generator(5, 2, 1))
    c = torch.rand(3, generator=unmask.step_generator(5, 2, 2))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("masked,steps", [(32, 32), (32, 5), (7, 3), (1, 1)])
def test_transfer_schedule(masked, steps):
    counts = transfer_counts(masked, steps)
    assert sum(counts) == masked and len(counts) == steps
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)


def test_steps_split_across_blocks_and_answer_rounding():
    assert [steps_per_block(10, 4, b) for b in range(4)] == [3, 3, 2, 2]
    assert answer_len(33, 32) == 64 and answer_len(32, 32) == 32


def test_any_steps_value_means_one_to_block_len_forwards_per_block():
    assert effective_steps(1, 128, 32) == 4                  # one per block at least
    assert effective_steps(131286, 32, 32) == 32             # one per answer position at most
    assert effective_steps(10, 128, 32) == 10
    for steps in (1, 3, 4, 7, 64, 128, 129, 10 ** 6):
        s = effective_steps(steps, 100, 32)
        split = [steps_per_block(s, 4, b) for b in range(4)]
        assert sum(split) == s and 1 <= min(split) and max(split) <= 32


def test_top_p_keeps_the_smallest_nucleus():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    kept = unmask.top_p_filter(x, 0.75).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    assert unmask.top_p_filter(x, 0.01).isfinite().sum() == 1
    for i in range(200):   # sampling never leaves the nucleus
        tok, _ = unmask.propose(x.float().view(1, 1, 4), [1.0], [unmask.step_generator(2, 0, i)], [1],
                                banned_id=3, top_p=[0.8])
        assert tok.item() in (0, 1)


def test_chunked_proposals_equal_one_pass():
    """Rows go through float64 in bounded chunks; the result does not depend on the chunking."""
    from dllm_server.decoding.unmask import propose, step_generator
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(7, 5, 50, generator=g) * 4
    temps = [0.0, 0.7, 0.0, 1.3, 0.0, 0.5, 0.0]
    widths = [5, 4, 5, 3, 5, 5, 2]
    top_p = [1.0, 0.9, 1.0, 1.0, 1.0, 0.5, 1.0]
    top_k = [0, 0, 3, 5, 0, 2, 0]
    min_p = [0.0, 0.1, 0.0, 0.0, 0.3, 0.0, 0.0]

    def run(chunk):
        gens = [step_generator(i, 0, 0) if t > 0 else None for i, t in enumerate(temps)]
        return propose(logits.clone(), temps, gens, widths, 49, top_p, top_k, min_p, chunk_elements=chunk)

    whole = run(1 << 25)
    for chunk in (1, 250, 600):                  # one row, one row, two rows per chunk
        tok, conf = run(chunk)
        assert torch.equal(tok, whole[0]) and torch.equal(conf, whole[1])
    assert not (whole[0] == 49).any()            # the banned (mask) id is never proposed


def _eb(score, entropy, masked, bound):
    return int(unmask.entropy_bounded_counts(torch.tensor([score], dtype=torch.float64),
                                             torch.tensor([entropy], dtype=torch.float64), torch.tensor([masked]),
                                             torch.tensor([bound], dtype=torch.float64))[0])


def test_entropy_bound_commits_the_longest_prefix_by_confidence():
    # ranked by score: entropies 0.1, 0.2, 0.3, 0.5; sum - max per prefix: 0, 0.1, 0.3, 0.6
    score, ent = [0.9, 0.8, 0.7, 0.6], [0.1, 0.2, 0.3, 0.5]
    assert _eb(score, ent, [True] * 4, 0.35) == 3
    assert _eb(score, ent, [True] * 4, 0.61) == 4
    assert _eb(score, ent, [True] * 4, 0.0) == 1                      # always at least the best one
    # the order is the score's, not the entropy's: a confident but high-entropy position comes first
    assert _eb([0.6, 0.9, 0.8, 0.7], [0.5, 0.1, 0.2, 0.3], [True] * 4, 0.35) == 3
    assert _eb([0.9, 0.95, 0.8, 0.7], [2.0, 0.1, 0.1, 0.1], [True] * 4, 0.25) == 3   # 0.1+2.0-2.0, +0.1 fails at 4
    # committed positions neither count nor spend the bound
    assert _eb(score, [5.0, 0.2, 5.0, 0.5], [False, True, False, True], 0.2) == 2
    assert _eb(score, ent, [False] * 4, 1.0) == 0


def test_raising_the_entropy_bound_never_commits_less():
    g = torch.Generator().manual_seed(1)
    score = torch.rand(40, generator=g, dtype=torch.float64).tolist()
    ent = (torch.rand(40, generator=g, dtype=torch.float64) * 3).tolist()
    counts = [_eb(score, ent, [True] * 40, b / 2) for b in range(0, 140)]     # the total entropy is < 70
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 40


def test_entropy_bound_in_commit_counts_and_its_precedence():
    c = torch.tensor([[0.95, 0.92, 0.5, 0.4]], dtype=torch.float64)
    h = torch.tensor([[0.2, 0.3, 1.0, 1.5]], dtype=torch.float64)
    m = torch.ones(1, 4, dtype=torch.bool)

    def count(bound=NAN, factor=NAN, fixed=-1):
        return int(unmask.commit_counts(c, m, torch.tensor([0.9], dtype=torch.float64),
                                        torch.tensor([factor], dtype=torch.float64), torch.tensor([fixed]),
                                        torch.tensor([bound], dtype=torch.float64), h)[0])
    assert count() == 2                          # no bound (NaN): the threshold rule
    assert count(bound=1.25) == 3                # 0.2 + 0.3 + 1.0 - 1.0 = 0.5 <= 1.25; + 1.5 -> 1.5 > 1.25
    assert count(bound=1.25, factor=0.01) == 1   # factor before entropy bound
    assert count(bound=1.25, fixed=4) == 4       # fixed steps before everything


def test_proposals_report_entropy_of_the_untempered_distribution():
    logits = torch.zeros(1, 2, 5)
    logits[0, 1, 2] = 1e4                        # one-hot
    logits[0, :, 4] = 50.0                       # the banned id takes no mass
    tok, conf, ent = unmask.propose(logits, [0.0], [None], [2], banned_id=4, with_entropy=True)
    assert ent[0, 0].item() == pytest.approx(math.log(4)) and ent[0, 1].item() == pytest.approx(0.0, abs=1e-12)
    hot = unmask.propose(logits, [2.0], [unmask.step_generator(1, 0, 0)], [2], banned_id=4, with_entropy=True)
    assert torch.equal(hot[2], ent)              # temperature changes the proposal, not the measure
    for chunk in (1, 5):                         # chunking changes nothing
        assert torch.equal(unmask.propose(logits, [0.0], [None], [2], 4, chunk_elements=chunk,
                                          with_entropy=True)[2], ent)


def test_first_position_only_forces_the_block_start():
    score = torch.tensor([[0.1, 0.9, 0.8], [0.1, 0.9, 0.8], [0.1, 0.9, 0.8]], dtype=torch.float64)
    masked = torch.ones(3, 3, dtype=torch.bool)
    count = torch.tensor([2, 2, 2])
    fixed = torch.tensor([-1, 2, -1])            # row 1 runs fixed steps, row 2 is not a first-only row
    s, n = unmask.first_position_only(score, count, torch.tensor([True, True, False]), fixed)
    commit = unmask.select_commits(s, masked, n)
    assert commit.tolist() == [[True, False, False], [True, True, False], [False, True, True]]


def _sample(x, n, **filters):
    """Tokens proposed for one position over n seeded steps (an extra last id is the banned mask)."""
    row = torch.cat([x.flatten().float(), torch.zeros(1)]).view(1, 1, -1)
    out = []
    for i in range(n):
        tok, _ = unmask.propose(row, [1.0], [unmask.step_generator(4, 0, i)], [1], banned_id=row.shape[-1] - 1,
                                **{k: [v] for k, v in filters.items()})
        out.append(tok.item())
    return out


def test_top_k_keeps_the_k_best_and_their_ties():
    x = torch.tensor([[1.0, 3.0, 2.0, 2.0, -1.0]], dtype=torch.float64)
    assert unmask.top_k_filter(x, 1).isfinite().tolist() == [[False, True, False, False, False]]
    assert unmask.top_k_filter(x, 2).isfinite().tolist() == [[False, True, True, True, False]]   # a tie at k
    assert unmask.top_k_filter(x, 0).isfinite().all() and unmask.top_k_filter(x, 99).isfinite().all()
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    assert set(_sample(logits, 300, top_k=2)) == {0, 1}          # never outside the two best, both reached


def test_top_k_one_proposes_exactly_what_greedy_proposes():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 6, 40, generator=g) * 3
    greedy = unmask.propose(logits, [0.0] * 3, [None] * 3, [6, 6, 4], banned_id=39)
    gens = [unmask.step_generator(s, 1, 2) for s in range(3)]
    hot = unmask.propose(logits, [1.0, 2.5, 0.3], gens, [6, 6, 4], banned_id=39, top_k=[1, 1, 1])
    assert torch.equal(greedy[0], hot[0]) and torch.equal(greedy[1], hot[1])   # tokens and confidences


def test_min_p_drops_tokens_far_below_the_best():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    assert unmask.min_p_filter(x, 0.5).isfinite().tolist() == [[True, True, False, False]]   # p >= 0.25
    assert unmask.min_p_filter(x, 1.0).isfinite().tolist() == [[True, False, False, False]]
    assert unmask.min_p_filter(x, 0.0).isfinite().all()
    free = _sample(x[0].float(), 400)
    kept = _sample(x[0].float(), 400, min_p=0.5)
    assert set(kept) == {0, 1} and 2 in free                      # min_p changes what is sampled


def test_filters_apply_in_order_top_k_top_p_min_p():
    x = torch.log(torch.tensor([[0.35, 0.3, 0.2, 0.15]], dtype=torch.float64))
    # top-k 3 renormalises to 0.41/0.35/0.24: top-p 0.7 then keeps two, min-p 0.9 then only the best
    assert unmask.filtered(x, 3, 0.7, 0.0).isfinite().tolist() == [[True, True, False, False]]
    assert unmask.filtered(x, 3, 0.7, 0.9).isfinite().tolist() == [[True, False, False, False]]
    assert torch.equal(unmask.filtered(x, 0, 1.0, 0.0), x)


def test_filtered_rows_do_not_depend_on_their_batch():
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(4, 5, 30, generator=g) * 2
    temps, widths = [0.9, 1.2, 0.0, 0.7], [5, 3, 5, 4]
    top_k, top_p, min_p = [3, 0, 0, 8], [1.0, 0.8, 1.0, 0.9], [0.0, 0.2, 0.0, 0.05]

    def gens(rows):
        return [unmask.step_generator(7 + b, 2, 1) if temps[b] > 0 else None for b in rows]
    batch = unmask.propose(logits, temps, gens(range(4)), widths, 29, top_p, top_k, min_p)
    for b in range(4):
        alone = unmask.propose(logits[b:b + 1], temps[b:b + 1], gens([b]), widths[b:b + 1], 29, top_p[b:b + 1],
                               top_k[b:b + 1], min_p[b:b + 1])
        assert torch.equal(alone[0][0], batch[0][b]) and torch.equal(alone[1][0], batch[1][b])
