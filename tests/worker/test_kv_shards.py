"""Which heads travel between which ranks when prefill and decode instances have TP degrees (worker/kv_shards.py),
checked for every pair of degrees of an 8-head model: each head goes exactly once, from the rank that holds it to the
rank that holds it, both ends agree on the pairs, and the followers' operations decode to what the leader did."""
import itertools

import torch

from dllm_server.messages import ReceiveKV
from dllm_server.worker.kv_shards import KVWorld, encode_receive, encode_sends, world_ranks
from dllm_server.worker.kv_transfer import SendItem
from dllm_server.worker.tp_handoff import _Reader

HEADS = 8


def test_world_ranks_are_consecutive_leaders_first():
    assert world_ranks([2, 1, 4]) == ((0, 1), (2,), (3, 4, 5, 6))
    assert world_ranks([1, 1]) == ((0,), (1,))        # degree 1 everywhere: a worker's rank is its id


def test_every_head_moves_once_between_the_ranks_that_hold_it():
    for p, d in itertools.product((1, 2, 4, 8), repeat=2):
        world = KVWorld(world_ranks([p, d]), HEADS)
        moved = []
        for i in range(p):
            for piece in world.pieces(0, i, 1):
                j = world.ranks[1].index(piece.peer)
                a, b = piece.mine
                c, e = piece.theirs
                assert b - a == e - c > 0
                heads_i = list(range(i * HEADS // p, (i + 1) * HEADS // p))[a:b]
                heads_j = list(range(j * HEADS // d, (j + 1) * HEADS // d))[c:e]
                assert heads_i == heads_j
                moved += heads_i
                # the receiving end computes the same pair, mirrored
                back = [q for q in world.pieces(1, j, 0) if q.peer == world.ranks[0][i]]
                assert len(back) == 1 and back[0].mine == piece.theirs and back[0].theirs == piece.mine
        assert sorted(moved) == list(range(HEADS)), (p, d)


def test_equal_degrees_pair_rank_to_rank_and_degree_one_sends_the_whole_block():
    world = KVWorld(world_ranks([2, 2]), HEADS)
    assert [(q.peer, q.mine) for q in world.pieces(0, 1, 1)] == [(3, (0, 4))]
    one = KVWorld(world_ranks([1, 1]), HEADS)
    assert [(q.peer, q.mine, q.theirs) for q in one.pieces(0, 0, 1)] == [(1, (0, 8), (0, 8))]
    two_to_one = KVWorld(world_ranks([2, 1]), HEADS)
    assert [(q.peer, q.mine) for q in two_to_one.pieces(1, 0, 0)] == [(0, (0, 4)), (1, (4, 8))]


def test_the_followers_operations_decode_to_the_leaders_sends_and_receives():
    ids = torch.tensor([5, 9, 3, 4])
    items = [SendItem("a", 0, slice(16, 20), 4, 1), SendItem("b", 0, ids, 4, 1), SendItem("c", 2, slice(0, 3), 3, 2)]
    code = encode_sends(items, {1: 40, 2: 0})
    r = _Reader(code, torch.device("cpu"))
    groups = []
    for _ in range(r.one()):
        dst, base, n = r.take(3)
        got = []
        for _ in range(n):
            length = r.one()
            got.append((length, r.slots(length)))
        groups.append((dst, base, got))
    assert [(g[0], g[1], len(g[2])) for g in groups] == [(1, 40, 2), (2, 0, 1)]
    assert groups[0][2][0] == (4, slice(16, 20)) and groups[0][2][1][1].tolist() == [5, 9, 3, 4]
    msg = ReceiveKV(0, ("a", "b"), (0, 0), (4, 6), (True, False), 12)
    r = _Reader(encode_receive(msg, [slice(8, 12), None]), torch.device("cpu"))
    assert r.take(3) == [0, 12, 2]
    assert r.one() == 4 and r.slots(4) == slice(8, 12)
    assert r.one() == 6 and r.slots(6) is None
