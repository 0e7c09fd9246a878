"""The token automaton and its block dynamic program (structured/automaton.py) on a hand-made vocabulary:
exact against brute force, never leaves the canvas uncompletable whatever subset is committed, and succeeds
where a left-to-right grammar mask fails because the model commits a late position first."""
import itertools
import math
import random
import re

import pytest
import torch

from dllm_server.structured.automaton import NO_PATH, TokenAutomaton

VOCAB = {b"a": [1], b"b": [2], b"c": [3], b"d": [4], b"ab": [5], b"{": [6], b"}": [7], b"1": [8]}
V, STOP, MASK = 10, 0, 9            # 0 ends the answer; 9 is the mask (never in the vocabulary)
TEXT = {i: s for s, ids in VOCAB.items() for i in ids}


def text_until_stop(tokens) -> str | None:
    """The answer the server would return: up to the first stop; None if a token is not text."""
    out = b""
    for t in tokens:
        if t == STOP:
            return out.decode()
        if t not in TEXT:
            return None
        out += TEXT[t]
    return out.decode()


def valid(regex: str, tokens) -> bool:
    """Complete: a stop after an accepted prefix (what follows it is cut), or the whole sequence accepted.
    A token path, not a string: a stop is only an end where the automaton accepts."""
    for i, t in enumerate(tokens):
        if t == STOP:
            return re.fullmatch(regex, text_until_stop(tokens[:i]) or "") is not None \
                if all(x in TEXT for x in tokens[:i]) else False
    s = text_until_stop(tokens)
    return s is not None and re.fullmatch(regex, s) is not None


def random_scores(k: int, rng: random.Random) -> torch.Tensor:
    x = torch.tensor([[rng.gauss(0, 2) for _ in range(V)] for _ in range(k)], dtype=torch.float64)
    x[:, MASK] = -math.inf
    return torch.log_softmax(x, dim=-1)


@pytest.mark.parametrize("regex", ["(ac|bd)c*", "a(b|c)*d", r"\{1*\}", "(ab|a)b?c", "d"])
def test_the_program_finds_the_best_valid_assignment(regex):
    a = TokenAutomaton(regex, VOCAB, (STOP,), V)
    rng = random.Random(0)
    for _ in range(30):
        k = 4
        scores = random_scores(k, rng)
        fixed = [None] * k
        if rng.random() < 0.5:                       # some positions already committed
            j = rng.randrange(k)
            fixed[j] = rng.randrange(V - 1)
        allowed = [range(V) if f is None else [f] for f in fixed]
        best = max((sum(float(scores[j, t]) for j, t in enumerate(seq)), seq)
                   for seq in itertools.product(*allowed) if valid(regex, seq)) if any(
            valid(regex, seq) for seq in itertools.product(*allowed)) else None
        got = a.best_assignment(scores, fixed, 0, 0, k, 0)
        if best is None:
            assert got is None
            continue
        assert got is not None and valid(regex, got.tolist())
        assert sum(float(scores[j, t]) for j, t in enumerate(got.tolist())) == pytest.approx(best[0], abs=1e-9)


def commit_loop(a: TokenAutomaton, regex: str, k: int, blocks: int, rng: random.Random, threshold: float):
    """Decode `blocks` blocks of `k` positions as the server does: each step the program's assignment, of which
    the confident positions (at least one) are committed; the state carried across blocks."""
    answer = []
    for b in range(blocks):
        block = [MASK] * k
        start = a.walk(0, answer)
        while MASK in block:
            scores = random_scores(k, rng)
            fixed = [None if t == MASK else t for t in block]
            got = a.best_assignment(scores, fixed, start, 0, None if b < blocks - 1 else k,
                                    (blocks - 1 - b) * k)
            assert got is not None, (regex, answer, block)
            conf = {j: math.exp(float(scores[j, got[j]])) for j in range(k) if block[j] == MASK}
            chosen = [j for j, c in conf.items() if c >= threshold] or [max(conf, key=conf.get)]
            for j in rng.sample(chosen, max(1, len(chosen) - rng.randrange(2))):   # any subset may commit
                block[j] = int(got[j])
        answer += block
    return answer


@pytest.mark.parametrize("regex", ["(ac|bd)c*", r"\{1*\}", "a(b|c)*d", "(ab|a)b?c"])
def test_committing_any_subset_keeps_the_answer_completable(regex):
    a = TokenAutomaton(regex, VOCAB, (STOP,), V)
    rng = random.Random(1)
    for trial in range(40):
        answer = commit_loop(a, regex, 4, 3, rng, threshold=rng.choice([0.9, 0.5, 0.2]))
        assert valid(regex, answer), (regex, answer)


def left_to_right_mask(a: TokenAutomaton, scores: torch.Tensor, block: list[int]) -> list[int]:
    """The left-to-right grammar engines' rule: mask the tokens the prefix state disallows, at the first open
    position only (later positions have no prefix yet), then commit the most confident position."""
    state = a.walk(0, [t for t in block[: block.index(MASK)]])
    s = scores.clone()
    lead = block.index(MASK)
    allowed = a.allowed(state) if state not in (NO_PATH, a.done) else set(range(V))
    for t in range(V):
        if t not in allowed:
            s[lead, t] = -math.inf
    best = max((float(s[j].max()), j) for j in range(len(block)) if block[j] == MASK)[1]
    out = list(block)
    out[best] = int(s[best].argmax())
    return out


def test_a_late_confident_position_breaks_a_left_to_right_mask_but_not_the_program():
    regex = "(ac|bd)"
    a = TokenAutomaton(regex, VOCAB, (STOP,), V)
    p = torch.full((2, V), 1e-9, dtype=torch.float64)
    p[0, 1], p[0, 2] = 0.6, 0.4          # position 0: "a" over "b"
    p[1, 4], p[1, 3] = 0.9, 0.1          # position 1, confidently "d": the model commits it first
    scores = torch.log(p / p.sum(-1, keepdim=True))
    block = [MASK, MASK]
    for _ in range(2):
        block = left_to_right_mask(a, scores, block)
    assert text_until_stop(block) == "ad" and not valid(regex, block)
    block = [MASK, MASK]
    while MASK in block:                 # the program: the same model, the same confidence-first commits
        got = a.best_assignment(scores, [None if t == MASK else t for t in block], 0, 0, 2, 0)
        open_ = [j for j in range(2) if block[j] == MASK]
        j = max(open_, key=lambda j: float(scores[j, got[j]]))
        block[j] = int(got[j])
        if len(open_) == 2:
            assert j == 1 and block[1] == 4  # it too commits the late position first
    assert text_until_stop(block) == "bd" and valid(regex, block)


def test_budget_and_shortest_answer():
    a = TokenAutomaton(r"\{1{3}\}", VOCAB, (STOP,), V)
    assert a.min_tokens == 5
    rng = random.Random(2)
    assert a.best_assignment(random_scores(4, rng), [None] * 4, 0, 0, 4, 0) is None   # cannot fit in 4
    got = a.best_assignment(random_scores(4, rng), [None] * 4, 0, 0, None, 1)         # 4 now, 1 later
    assert text_until_stop(got.tolist()) in ("{111", "{111}")
    assert a.walk(0, [6, 8, 8, 8, 7, STOP, 3]) == a.done and a.walk(0, [7]) == NO_PATH
