"""The per-row commit rule: each row follows its own block policy (threshold, factor, fixed
steps) and its own seeded sampler, whatever else shares the batch."""
import torch

from dllm_server.decoding.commit import CommitRow, commit_step, fixed_count
from dllm_server.decoding.params import BlockPolicy, SamplingParams

MASK = 9
GREEDY = SamplingParams(max_tokens=8).resolve(4, 1)
HOT = SamplingParams(max_tokens=8, temperature=1.0).resolve(4, 1)


def logits_for(confidences):
    """[K, V] logits whose argmax (token = position index) has the given softmax confidence."""
    k, v = len(confidences), 10
    out = torch.full((k, v), 0.0)
    for i, c in enumerate(confidences):
        rest = (1 - c) / (v - 1)
        out[i] = torch.log(torch.full((v,), rest))
        out[i, i] = torch.log(torch.tensor(c))
    return out


def test_rows_follow_their_own_policies():
    conf = [0.97, 0.85, 0.6, 0.3]
    logits = torch.stack([logits_for(conf)] * 4)
    masked = torch.ones(4, 4, dtype=torch.bool)
    rows = [CommitRow(4, GREEDY, BlockPolicy(0.95), 0, 1), CommitRow(4, GREEDY, BlockPolicy(0.5), 0, 1),
            CommitRow(4, GREEDY, BlockPolicy(0.99), 0, 1), CommitRow(4, GREEDY, BlockPolicy(0.9, steps=2), 0, 0)]
    commit, tokens = commit_step(logits, masked, rows, MASK)
    assert commit.sum(dim=1).tolist() == [1, 3, 1, 2]           # >= 0.95; >= 0.5; none but the best; 4 / 2 steps
    assert commit[1].tolist() == [True, True, True, False] and tokens[0, :4].tolist() == [0, 1, 2, 3]
    factor = commit_step(logits[:1], masked[:1], [CommitRow(4, GREEDY, BlockPolicy(0.9, factor=1.0), 0, 1)], MASK)
    assert factor[0].sum() == 2                                 # c1 >= 1 - 1/2, c2 >= 1 - 1/3, c3 < 1 - 1/4
    assert fixed_count(BlockPolicy(0.9, steps=3), 8, 0) == 3 and fixed_count(BlockPolicy(0.9, steps=3), 8, 9) == 2


def test_a_row_does_not_depend_on_its_batch():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 10)
    masked = torch.tensor([[True, True, False, True], [True] * 4, [False, True, True, True]])
    rows = [CommitRow(4, HOT, BlockPolicy(0.2), b, 2) for b in range(3)]
    batch = commit_step(logits, masked, rows, MASK)
    for b in range(3):
        alone = commit_step(logits[b:b + 1], masked[b:b + 1], rows[b:b + 1], MASK)
        assert torch.equal(alone[0][0], batch[0][b]) and torch.equal(alone[1][0], batch[1][b])
    assert not batch[0][0, 2] and not batch[0][2, 0]           # unmasked positions never commit
    assert (batch[1] != MASK).all()                             # the mask token is never proposed


def test_entropy_bound_rows_are_batch_invariant_and_seeded():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 4, 10, generator=g) * 3
    masked = torch.ones(4, 4, dtype=torch.bool)
    rows = [CommitRow(4, HOT, BlockPolicy(0.9, entropy_bound=1.0), 0, 1), CommitRow(4, GREEDY, BlockPolicy(0.3), 0, 1),
            CommitRow(4, GREEDY, BlockPolicy(0.9, entropy_bound=0.5), 1, 1),
            CommitRow(4, HOT, BlockPolicy(0.9, entropy_bound=1e6), 2, 1)]
    batch = commit_step(logits, masked, rows, MASK)
    for b in range(4):
        alone = commit_step(logits[b:b + 1], masked[b:b + 1], rows[b:b + 1], MASK)
        assert torch.equal(alone[0][0], batch[0][b]) and torch.equal(alone[1][0], batch[1][b])
    assert batch[0][3].all()                                    # an unbounded budget commits everything
    again = commit_step(logits, masked, rows, MASK)
    assert torch.equal(again[1], batch[1])                     # same seed and coordinates, same tokens


def test_first_only_rows_commit_the_block_start_alone():
    conf = [0.3, 0.97, 0.96, 0.2]
    logits = torch.stack([logits_for(conf)] * 2)
    masked = torch.ones(2, 4, dtype=torch.bool)
    rows = [CommitRow(4, GREEDY, BlockPolicy(0.9), 0, 0, first_only=True), CommitRow(4, GREEDY, BlockPolicy(0.9), 0, 0)]
    commit, tokens = commit_step(logits, masked, rows, MASK)
    assert commit[0].tolist() == [True, False, False, False] and tokens[0, 0] == 0
    assert commit[1].tolist() == [False, True, True, False]
