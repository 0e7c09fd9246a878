"""The same mixed requests give token-identical results in every placement and offline."""
import asyncio
import random

import pytest

from dllm_server import LLM, SamplingParams

from tests.live import running


def mixed_requests(n=32):
    rng = random.Random(11)
    reqs = []
    for i in range(n):
        prompt = {"prompt_token_ids": [rng.randrange(1, 250) for _ in range(rng.randrange(2, 60))]}
        params = SamplingParams(max_tokens=rng.choice([4, 8, 20, 33, 48]), temperature=rng.choice([0.0, 0.8]),
                                seed=i, threshold=rng.choice([0.9, 0.4]), ignore_eos=i % 3 != 0)
        reqs.append((prompt, params))
    return reqs


@pytest.fixture(scope="module")
def offline_tokens(tiny_llada):
    llm = LLM(tiny_llada, block_length=8, dtype="float32")
    reqs = mixed_requests()
    return [o.token_ids for o in llm.generate([p for p, _ in reqs], [s for _, s in reqs])]


async def test_dream_disaggregated_matches_offline(tiny_dream):
    """Dream's shifted logits survive a KV handoff (the decode window starts one position early)."""
    from dllm_server.config import ServerConfig
    reqs = mixed_requests(12)
    offline = LLM(tiny_dream, block_length=8, dtype="float32").generate([p for p, _ in reqs], [s for _, s in reqs])
    config = ServerConfig(model=tiny_dream, block_length=8, dtype="float32", threads_per_worker=1,
                          placement="disaggregated")
    async with running(config) as engine:
        outs = await asyncio.gather(*[engine.run(p, s) for p, s in reqs])
        assert engine.stats().counters.kv_transfer_bytes > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in offline]


@pytest.mark.parametrize("placement,kv_transfer", [("colocated", "layerwise"), ("disaggregated", "layerwise"),
                                                   ("disaggregated", "after_prefill"), ("hybrid", "layerwise")])
async def test_placements_match_offline(engine_config, offline_tokens, placement, kv_transfer):
    config = engine_config.replace(placement=placement, num_workers=2 if placement == "colocated" else 1,
                                   num_prefill_workers=1, overflow_threshold_tokens=200, kv_transfer=kv_transfer)
    async with running(config) as engine:
        outs = await asyncio.gather(*[engine.run(p, s) for p, s in mixed_requests()])
        assert [o.token_ids for o in outs] == offline_tokens
        assert all(o.finish_reason in ("stop", "length") for o in outs)
        stats = engine.stats()
        counters = stats.counters
        if placement == "disaggregated":
            assert counters.kv_transfer_bytes > 0 and counters.prefills_overflowed == 0
            # every block that did not finish inside its prefill step moved, and was timed
            assert counters.kv_handoffs > 0 and counters.kv_handoff_stall_seconds > 0
            assert counters.kv_transfers_failed == 0
        if placement == "hybrid":
            assert counters.prefills_overflowed > 0 and counters.kv_transfer_bytes > 0
        assert not stats.num_requests and stats.num_waiting == 0
