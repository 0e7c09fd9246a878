"""Block-causal decoding (SDAR) served by real worker processes: token-identical to the independent
no-cache reference loop over stock Qwen3 (tests/model/sdar_reference.py) on 20 random prompts,
threshold and fixed-steps rules, one request at a time and all at once, in every placement; the
fused finalise equals the separate one and the full recompute; the prefix cache skips the shared
prompt blocks' forward, answers identically and evicts under memory pressure without losing a
request. float64 on both sides: the comparison does not rest on one CPU's float32 kernels."""
import asyncio
import random

import pytest
import torch

from dllm_server import LLM, SamplingParams
from dllm_server.config import ServerConfig
from dllm_server.decoding.canvas import num_blocks

from tests.model import sdar_reference as ref

from tests.live import running

pytest.importorskip("transformers")
B = 4                                   # the tiny checkpoint's block_size
RULES = {"t0.9": {"threshold": 0.9}, "t0.5": {"threshold": 0.5}, "s2": {"steps_per_block": 2},
         "s4": {"steps_per_block": 4}}


def _cases():
    rng = random.Random(30)
    cases = []
    for i in range(20):
        prompt = [rng.randrange(0, 256) for _ in range(rng.randrange(3, 30))]
        max_tokens = rng.choice([5, 12, 19])
        for rule in RULES:
            cases.append((prompt, max_tokens, rule, i % 2 == 0))    # even prompts ignore EOS
    return cases


CASES = _cases()


def _params(prompt, max_tokens, rule, ignore_eos, seed):
    r = RULES[rule]
    if "threshold" in r:
        return SamplingParams(max_tokens=max_tokens, threshold=r["threshold"], ignore_eos=ignore_eos, seed=seed)
    steps = r["steps_per_block"] * num_blocks(max_tokens, B, len(prompt), absolute=True)
    return SamplingParams(max_tokens=max_tokens, steps=steps, ignore_eos=ignore_eos, seed=seed)


def _requests():
    return [({"prompt_token_ids": p}, _params(p, m, r, e, i)) for i, (p, m, r, e) in enumerate(CASES)]


@pytest.fixture(scope="module")
def reference(tiny_sdar):
    """The oracle's answers. Its fixed-steps schedule splits the block width (SDAR's and diffusers'
    rule, which the engine follows; only a partial first block can tell the two apart)."""
    out = []
    for p, m, rule, ignore_eos in CASES:
        out.append(ref.reference_generate_plain(tiny_sdar, p, m, stop_ids=() if ignore_eos else None,
                                                dtype=torch.float64, schedule_over="block",
                                                **RULES[rule]))
    return out


def test_offline_batch_one_and_loaded_match_the_reference(tiny_sdar, reference):
    llm = LLM(tiny_sdar, dtype="float64")
    reqs = _requests()
    one_by_one = [llm.generate([p], [s])[0].token_ids for p, s in reqs]
    assert one_by_one == reference
    assert [o.token_ids for o in llm.generate([p for p, _ in reqs], [s for _, s in reqs])] == reference
    assert any(len(set(o)) > 1 for o in reference)          # not a degenerate answer set


@pytest.mark.parametrize("mode", ["separate", "recompute"])
def test_fused_finalise_equals_separate_and_recompute(tiny_sdar, mode):
    """The fused finalise (a finished block's KV written in the next block's first forward) gives
    the answers of a forward of its own and of recomputing the whole prefix, with fewer forwards."""
    reqs = _requests()[:24]
    runs = {}
    for m in ("fused", mode):
        llm = LLM(tiny_sdar, dtype="float64", block_causal_finalise=m)
        runs[m] = ([llm.generate([p], [s])[0].token_ids for p, s in reqs], llm.core.stepper.num_forwards)
    assert runs["fused"][0] == runs[mode][0]
    if mode == "separate":             # one forward a finished block saved (batch 1: nothing shares)
        assert runs["fused"][1] < runs[mode][1]


@pytest.mark.parametrize("placement", ["colocated", "disaggregated", "hybrid"])
async def test_placements_match_the_reference(tiny_sdar, reference, placement):
    config = ServerConfig(model=tiny_sdar, dtype="float64", threads_per_worker=1, placement=placement,
                          num_workers=2 if placement == "colocated" else 1, num_prefill_workers=1,
                          overflow_threshold_tokens=30)
    reqs = _requests()
    async with running(config) as engine:
        outs = await asyncio.gather(*[engine.run(p, s) for p, s in reqs])
        stats = engine.stats()
        assert [o.token_ids for o in outs] == reference
        c = stats.counters
        if placement == "disaggregated":
            # the prompt KV crosses once: no request hands over twice (one that ends in its
            # prefill forward never does)
            assert 0 < c.kv_handoffs <= len(reqs) and c.kv_transfers_failed == 0
        if placement == "hybrid":
            assert c.prefills_overflowed > 0
        assert not stats.num_requests
        for w in stats.workers:
            assert w.free_pages == w.num_pages      # every page back (cached ones count as free)


def _shared_prompt_requests(n, prompt_len=150, seed=7):
    rng = random.Random(seed)
    shared = [rng.randrange(0, 256) for _ in range(prompt_len)]
    return [({"prompt_token_ids": shared + [rng.randrange(0, 256) for _ in range(rng.randrange(1, 9))]},
             SamplingParams(max_tokens=8, threshold=0.7, ignore_eos=True)) for _ in range(n)]


async def test_prefix_cache_skips_the_shared_blocks(tiny_sdar):
    """The second request with the same long prompt feeds nothing of the cached units (counted
    with the positions the workers fed) and answers as without the cache."""
    p, s = _shared_prompt_requests(1)[0]
    plen = len(p["prompt_token_ids"])
    off = LLM(tiny_sdar, dtype="float64", enable_prefix_caching=False).generate([p, p], [s, s])
    config = ServerConfig(model=tiny_sdar, dtype="float64", threads_per_worker=1, page_size=16)
    cached = (plen // B * B) // 16 * 16        # whole 16-token units inside the complete prompt blocks
    async with running(config) as engine:
        before = engine.stats().counters.canvas_positions
        first = await engine.run(p, s)
        mid = engine.stats().counters.canvas_positions
        second = await engine.run(p, s)
        stats = engine.stats()
    fed_first, fed_second = mid - before, stats.counters.canvas_positions - mid
    assert fed_first - fed_second == cached > 100
    assert [first.token_ids, second.token_ids] == [o.token_ids for o in off]
    hits, queries, pages, evicted = stats.workers[0].prefix_cache
    assert (hits, queries, pages, evicted) == (cached, 2 * cached, cached // 16, 0)


async def test_prefix_cache_evicts_under_memory_pressure_and_loses_nothing(tiny_sdar):
    """Four prompt families, ten requests each, on a worker with room for about three canvases:
    cached units are reclaimed (least recently used) as the pages run short, every request
    finishes with the answer it has without a cache."""
    reqs = [r for seed in (1, 2, 3, 4) for r in _shared_prompt_requests(10, prompt_len=100, seed=seed)]
    random.Random(0).shuffle(reqs)
    off = LLM(tiny_sdar, dtype="float64", enable_prefix_caching=False).generate([p for p, _ in reqs],
                                                                            [s for _, s in reqs])
    config = ServerConfig(model=tiny_sdar, dtype="float64", threads_per_worker=1, page_size=16,
                          kv_cache_tokens=16 * 24)
    async with running(config) as engine:
        outs = []
        for i in range(0, len(reqs), 4):      # a few at a time: the pool holds about three
            outs += await asyncio.gather(*[engine.run(p, s) for p, s in reqs[i:i + 4]])
        stats = engine.stats()
    assert [o.token_ids for o in outs] == [o.token_ids for o in off]
    assert all(o.finish_reason == "length" for o in outs)
    hits, queries, pages, evicted = stats.workers[0].prefix_cache
    assert hits > 0 and evicted > 0 and pages * 16 <= 16 * 24
