"""Dream under the prefix and dual caches decodes as Fast-dLLM's Dream block sampler, token for
token: a plain oracle with its own dense K/V cache (oracles.dream_block_reference) pins the two
rules (a block's full forward commits only its first position; cached steps feed from the block
start and keep the K/V of the position before it from that full forward). The shifted variant
must differ from it, or the oracle would pin nothing."""
import pytest
import torch

from dllm_server import LLM, SamplingParams
from dllm_server.model.loader import load_model
from dllm_server.worker.kv_pool import KVPool
from dllm_server.worker.runner import ForwardItem, ModelRunner, fed_range, window_lead
from dllm_server.config import TestHooks

CAUSAL = TestHooks(causal=True)      # the cache-exactness oracle: causal attention

from .oracles import _dream_forward, dream_block_reference

PROMPTS = [[72, 101, 108, 108, 111], [84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98],
           [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180]]
BLOCK, ANSWER = 8, 24


def _generate(path, cache, threshold, decoding, causal=False):
    # float64 (RMSNorm in float32), so the paged cache and the oracle's dense one agree to ~1e-6
    llm = LLM(path, cache=cache, block_length=BLOCK, dtype="float64", page_size=4, dream_decoding=decoding,
              hooks=TestHooks(causal=causal))
    params = SamplingParams(max_tokens=ANSWER, threshold=threshold, ignore_eos=True)
    return llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)


@pytest.mark.parametrize("threshold", [0.9, 0.2])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_dream_caches_decode_as_fast_dllm_block_sampler(tiny_dream, cache, threshold):
    model, _, _ = load_model(tiny_dream, dtype="float64")
    expected = [dream_block_reference(model, p, ANSWER, BLOCK, threshold, cache) for p in PROMPTS]
    outs = _generate(tiny_dream, cache, threshold, "fast_dllm")
    assert [o.token_ids for o in outs] == expected
    shifted = _generate(tiny_dream, cache, threshold, "shifted")
    assert [o.token_ids for o in shifted] != expected
    if threshold < 0.5:          # the threshold rule is exercised: several commits in one forward
        assert max(o.tokens_per_forward for o in outs) > 1.0


def test_fast_dllm_rules_are_the_default_and_exact_under_causal_attention(tiny_dream):
    # Under causal attention stale K/V cannot matter: both caches equal the oracle run causally.
    model, _, _ = load_model(tiny_dream, dtype="float64")
    expected = [dream_block_reference(model, p, ANSWER, BLOCK, 0.3, "dual", causal=True) for p in PROMPTS]
    for cache in ("prefix", "dual"):
        llm = LLM(tiny_dream, cache=cache, block_length=BLOCK, dtype="float64", hooks=CAUSAL)
        assert llm.config.dream_decoding == "fast_dllm"
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                            SamplingParams(max_tokens=ANSWER, threshold=0.3, ignore_eos=True))
        assert [o.token_ids for o in outs] == expected


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_step_keeps_the_kv_before_the_block_from_the_full_forward(tiny_dream, cache):
    # Logit-level: tokens of a random tiny model hardly depend on one stale position, logits do.
    model, args, dtype = load_model(tiny_dream, dtype="float64")
    pool = KVPool(args.num_layers, 64, 4, args.num_kv_heads, args.head_dim, dtype)
    runner = ModelRunner(model, args, pool, torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    p, n = 11, 11 + 24
    s, e = p + BLOCK, p + 2 * BLOCK
    canvas = torch.full((n,), args.mask_id, dtype=torch.int64)
    canvas[:s] = torch.randint(0, 256, (s,), generator=g)
    alloc = pool.allocate("r", n)
    runner.forward([ForwardItem(canvas, alloc, 0, n, s, e)])                 # the block's full forward
    _, dense = _dream_forward(model, canvas, 0, n, None, False)
    canvas[s], canvas[s + 3] = 5, 9                                          # commits since then
    with torch.inference_mode():
        window, _ = _dream_forward(model, canvas, s, e if cache == "dual" else n, dense, False)
    expected = torch.cat([window[:1], window[:-1]])[: e - s]
    got = {}
    for decoding in ("fast_dllm", "shifted"):                 # fast_dllm first: shifted rewrites s - 1
        a, b = fed_range(cache, False, s, e, n, window_lead(args.logit_shift, decoding))
        got[decoding] = runner.forward([ForwardItem(canvas, alloc, a, b, s, e)])[0].double()
    # RMSNorm runs in float32 in both: ~5e-7 apart; recomputing s - 1 moves logits by ~0.07
    torch.testing.assert_close(got["fast_dllm"][1:], expected[1:], rtol=0, atol=1e-5)
    assert (got["shifted"][1:] - expected[1:]).abs().max() > 1e-3
