"""Causal oracle: under causal attention stale K/V cannot matter, so prefix and dual caches must
reproduce cache=none exactly. Catches RoPE, position, slicing and paging bugs. For Dream that
holds for the shifted window; under Fast-dLLM's rules (the default) a block's full forward
commits only its first position, which cache=none does not, so there the two caches must agree
with each other (and with their own oracle, test_dream_reference.py)."""
import pytest

from dllm_server import LLM, SamplingParams
from dllm_server.config import TestHooks

CAUSAL = TestHooks(causal=True)      # the cache-exactness oracle: causal attention

PROMPTS = [[72, 101, 108, 108, 111], [84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98],
           [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180]]

RULES = [dict(), dict(threshold=0.3), dict(steps=12), dict(factor=1.0), dict(temperature=0.8, seed=5)]


@pytest.mark.parametrize("rule", RULES, ids=["thr0.9", "thr0.3", "steps", "factor", "temp"])
def test_prefix_and_dual_equal_none_under_causal_attention(tiny_model, rule):
    params = SamplingParams(max_tokens=24, ignore_eos=True, **rule)
    results = {}
    for decoding in ("shifted", "fast_dllm"):
        for cache in ("none", "prefix", "dual"):
            # Small pages make each canvas span several pages, some non-contiguous after reuse.
            llm = LLM(tiny_model, cache=cache, block_length=8, hooks=CAUSAL, dtype="float32", page_size=4,
                      dream_decoding=decoding)
            results[decoding, cache] = [o.token_ids for o in
                                        llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
            if llm.args.logit_shift == 0:      # LLaDA: the Dream variants do not apply
                assert results[decoding, cache] == results["shifted", cache]
    assert results["shifted", "prefix"] == results["shifted", "none"]
    assert results["shifted", "dual"] == results["shifted", "none"]
    assert results["fast_dllm", "dual"] == results["fast_dllm", "prefix"]


def test_threshold_commits_several_tokens_per_forward_somewhere(tiny_model):
    # The oracle above is only meaningful if parallel commits actually happen.
    llm = LLM(tiny_model, cache="dual", block_length=8, hooks=CAUSAL, dtype="float32")
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], SamplingParams(max_tokens=24, threshold=0.3,
                                                                                   ignore_eos=True))
    assert max(o.tokens_per_forward for o in outs) > 1.0
