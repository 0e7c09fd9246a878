"""The prefix cache's bookkeeping over a real KVPool (worker/prefix_cache.py): chains, references,
donation, least-recently-used eviction, and the pool's page accounting throughout."""
import torch

from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.prefix_cache import PrefixCache


def _pool(num_pages=16, page_size=4, block=4):
    pool = KVPool(1, num_pages, page_size, 1, 2, torch.float32)
    return pool, PrefixCache(pool, block)


def _serve(pool, cache, rid, canvas, cacheable):
    """What the core does for one request: look up, allocate past the hits, then end (donate)."""
    keys = cache.keys(canvas, cacheable)
    shared = cache.lookup(keys)
    alloc = pool.allocate(rid, canvas.numel(), shared)
    return keys, len(shared) // cache.unit_pages, alloc


def test_unit_is_whole_pages_ending_on_a_block_boundary():
    assert _pool(page_size=4, block=4)[1].unit_tokens == 4
    assert _pool(page_size=4, block=8)[1].unit_tokens == 8      # two pages
    assert _pool(page_size=16, block=4)[1].unit_tokens == 16    # four blocks
    assert _pool(page_size=4, block=6)[1].unit_tokens == 12


def test_keys_chain_over_the_whole_prefix():
    _, cache = _pool()
    a = torch.arange(20)
    b = a.clone()
    b[1] = 99                                  # differs in the first unit only
    ka, kb = cache.keys(a, 18), cache.keys(b, 18)
    assert len(ka) == 4                        # units wholly inside the first 18 positions
    assert all(x != y for x, y in zip(ka, kb))  # every later key depends on what came before
    assert cache.keys(a, 12) == ka[:3]


def test_second_request_shares_the_first_ones_units_and_nothing_referenced_is_freed():
    pool, cache = _pool()
    canvas = torch.arange(24)
    keys, hits, alloc = _serve(pool, cache, "a", canvas, 16)
    assert hits == 0 and pool.num_free_pages == 10
    cache.release(keys, hits, alloc.pages)     # a ends: its 4 prompt pages stay cached
    pool.free("a")
    assert pool.num_free_pages == 12 and cache.num_cached_pages == 4 and pool.num_available_pages == 16
    pool.check_integrity()

    keys_b, hits_b, alloc_b = _serve(pool, cache, "b", canvas, 16)
    assert hits_b == 4 and alloc_b.pages[:4] == alloc.pages[:4] and alloc_b.shared == 4
    keys_c, hits_c, alloc_c = _serve(pool, cache, "c", canvas, 16)
    assert alloc_c.pages[:4] == alloc.pages[:4]
    assert cache.hit_tokens == 32 and cache.query_tokens == 48
    cache.release(keys_b, hits_b, alloc_b.pages)
    pool.free("b")
    # c still references the shared units: a pool short of pages must not take them
    assert cache.evict(100) == 0
    assert all(not pool._is_free[p] for p in alloc_c.pages)
    pool.check_integrity()
    cache.release(keys_c, hits_c, alloc_c.pages)
    pool.free("c")
    assert pool.num_free_pages == 12 and cache.num_idle_pages == 4
    pool.check_integrity()


def test_memory_pressure_evicts_least_recently_used_units_first():
    pool, cache = _pool(num_pages=8, block=8)      # a unit: two pages
    old, new = torch.arange(8), torch.arange(100, 108)
    for rid, canvas in (("old", old), ("new", new)):
        keys, hits, alloc = _serve(pool, cache, rid, canvas, 8)   # one cacheable unit each
        cache.release(keys, hits, alloc.pages)
        pool.free(rid)
    assert pool.num_free_pages == 4 and pool.num_available_pages == 8
    # 5 fresh pages wanted: one unit (the older) is reclaimed, the newer stays cached
    pool.allocate("big", 20)
    assert cache.evicted_pages == 2
    assert cache.peek(cache.keys(old, 8)) == 0 and cache.peek(cache.keys(new, 8)) == 1
    pool.check_integrity()


def test_a_request_whose_kv_was_never_written_donates_nothing():
    pool, cache = _pool()
    keys, hits, _ = _serve(pool, cache, "a", torch.arange(24), 16)
    cache.release(keys, hits, None)            # aborted before its prefill ran
    pool.free("a")
    assert cache.num_cached_pages == 0 and pool.num_free_pages == 16
    pool.check_integrity()


def test_a_unit_cached_already_is_not_donated_twice():
    pool, cache = _pool()
    canvas = torch.arange(24)
    ka, ha, aa = _serve(pool, cache, "a", canvas, 16)
    kb, hb, ab = _serve(pool, cache, "b", canvas, 16)   # both missed: computed twice, concurrently
    cache.release(ka, ha, aa.pages)
    pool.free("a")
    cache.release(kb, hb, ab.pages)
    pool.free("b")
    assert cache.num_cached_pages == 4 and pool.num_free_pages == 12
    pool.check_integrity()
