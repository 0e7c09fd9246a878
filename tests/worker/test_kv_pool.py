"""The page allocator: contiguous runs when possible, integrity always."""
import random

import pytest
import torch

from dllm_server.worker.kv_pool import KVPool


def test_allocate_free_and_integrity_under_random_churn():
    pool = KVPool(1, 64, 4, 1, 2, torch.float32)
    rng = random.Random(0)
    live = {}
    for i in range(500):
        if live and rng.random() < 0.5:
            owner = rng.choice(sorted(live))
            pool.free(owner)
            del live[owner]
        else:
            n = rng.randrange(1, 40)
            if pool.can_allocate(n):
                a = pool.allocate(f"o{i}", n)
                live[f"o{i}"] = a
                slots = (torch.arange(a.slot_base, a.slot_base + n) if a.slot_ids is None else a.slot_ids)
                assert slots.numel() == n and len(set(slots.tolist())) == n
        pool.check_integrity()
    for owner in list(live):
        pool.free(owner)
    assert pool.num_free_pages == 64 and not pool.owners()


def test_prefers_contiguous_runs():
    pool = KVPool(1, 8, 4, 1, 2, torch.float32)
    pool.allocate("a", 8)
    a = pool.allocate("b", 12)
    assert a.slot_ids is None and a.slot_base == 8
    pool.free("a")
    c = pool.allocate("c", 12)     # pages 0,1 free and 5,6,7: a run of 3 exists at 5..7
    assert c.slot_ids is None and c.slot_base == 20


def test_rename_moves_ownership_and_the_scratch_page_is_never_handed_out():
    pool = KVPool(1, 6, 4, 1, 2, torch.float32)
    assert pool.layers[0].k.shape[0] == 7 * 4 and pool.scratch_page == 6   # one page past the pool
    a = pool.allocate("req", 8)
    assert pool.rename("req", "req\x00out0") is a
    b = pool.allocate("req", 8)          # the request's next block while its old pages are in flight
    assert set(a.pages).isdisjoint(b.pages)
    assert pool.rename("nobody", "x") is None
    with pytest.raises(RuntimeError, match="already allocated"):
        pool.rename("req", "req\x00out0")         # never onto a live owner
    pool.free("req\x00out0"), pool.free("req")
    pool.allocate("all", 24)             # every allocatable page
    assert pool.num_free_pages == 0 and not pool.can_allocate(1)
    assert pool.scratch_page not in pool._owner["all"].pages
    pool.check_integrity()
