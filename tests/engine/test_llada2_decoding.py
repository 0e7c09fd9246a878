"""LLaDA2 decoding (block-causal MoE, blocks of 32 on the absolute grid) token-identical to the no-cache reference
loop over the stock-parts reference model (tests/model/sdar_reference.py driving llada2_reference.py), offline one
request at a time and batched; the prefix cache skips the shared prompt blocks. float64 on both sides."""
import random

import pytest
import torch

from dllm_server import LLM, SamplingParams

from tests.live import running
from tests.model import sdar_reference as ref

pytest.importorskip("transformers")
RULES = {"t0.95": {"threshold": 0.95}, "t0.7": {"threshold": 0.7}, "t0.5": {"threshold": 0.5}}


def cases() -> list[tuple[list[int], int, str, bool]]:
    """12 prompts of 3-70 byte tokens (first answer blocks from 2 to 32 masks), answers of 20-70 tokens."""
    rng = random.Random(42)
    out = []
    for i in range(12):
        prompt = [rng.randrange(0, 256) for _ in range(rng.randrange(3, 70))]
        max_tokens = rng.choice([20, 45, 70])
        for rule in RULES:
            out.append((prompt, max_tokens, rule, i % 2 == 0))          # even prompts ignore EOS
    return out


CASES = cases()


def requests() -> list[tuple[dict, SamplingParams]]:
    return [({"prompt_token_ids": p}, SamplingParams(max_tokens=m, ignore_eos=e, seed=i, **RULES[r]))
            for i, (p, m, r, e) in enumerate(CASES)]


@pytest.fixture(scope="module")
def reference(tiny_llada2):
    return [ref.reference_generate_plain(tiny_llada2, p, m, stop_ids=() if e else None, dtype=torch.float64,
                                         **RULES[r]) for p, m, r, e in CASES]


def test_offline_one_at_a_time_and_batched_match_the_reference(tiny_llada2, reference):
    llm = LLM(tiny_llada2, dtype="float64")
    reqs = requests()
    assert [llm.generate([p], [s])[0].token_ids for p, s in reqs] == reference
    outs = llm.generate([p for p, _ in reqs], [s for _, s in reqs])
    assert [o.token_ids for o in outs] == reference
    assert sum(len(o) for o in reference) > 500 and any(len(set(o)) > 5 for o in reference)
    per_forward = sum(len(o.token_ids) for o in outs) / sum(o.stats.num_forwards for o in outs)
    assert per_forward > 1.0                    # blocks of 32 commit several positions a forward


async def test_prefix_cache_skips_the_shared_prompt_blocks(tiny_llada2):
    rng = random.Random(7)
    shared = [rng.randrange(0, 256) for _ in range(150)]
    p = {"prompt_token_ids": shared + [5, 6, 7]}
    s = SamplingParams(max_tokens=12, threshold=0.7, ignore_eos=True)
    off = LLM(tiny_llada2, dtype="float64", enable_prefix_caching=False).generate([p, p], [s, s])
    from dllm_server.config import ServerConfig
    config = ServerConfig(model=tiny_llada2, dtype="float64", threads_per_worker=1, page_size=16)
    cached = 150 // 32 * 32 // 16 * 16           # whole 16-token pages inside the complete 32-token prompt blocks
    async with running(config) as engine:
        before = engine.stats().counters.canvas_positions
        first = await engine.run(p, s)
        mid = engine.stats().counters.canvas_positions
        second = await engine.run(p, s)
        stats = engine.stats()
    assert (mid - before) - (stats.counters.canvas_positions - mid) == cached == 128
    assert [first.token_ids, second.token_ids] == [o.token_ids for o in off]
    assert stats.workers[0].prefix_cache[0] == cached
