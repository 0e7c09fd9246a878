"""The page allocator: contiguous runs when possible, integrity always."""
import random

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
