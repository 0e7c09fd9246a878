"""A request's tokens do not depend on what it is batched with."""
import random

from dllm_server import LLM, SamplingParams


def _requests():
    rng = random.Random(7)
    reqs = []
    for i in range(16):
        prompt = [rng.randrange(0, 256) for _ in range(rng.randrange(3, 40))]
        params = SamplingParams(max_tokens=rng.choice([5, 16, 24, 40]), ignore_eos=True,
                                temperature=0.0 if i % 2 == 0 else 0.9, seed=100 + i,
                                threshold=rng.choice([0.9, 0.5]))
        reqs.append(({"prompt_token_ids": prompt}, params))
    return reqs


def test_alone_equals_batched(tiny_model):
    reqs = _requests()
    llm = LLM(tiny_model, block_length=8, dtype="float32")
    alone = [llm.generate([p], params)[0].token_ids for p, params in reqs]
    batched = llm.generate([p for p, _ in reqs], [params for _, params in reqs])
    assert [o.token_ids for o in batched] == alone
    assert all(len(t) == params.max_tokens for t, (_, params) in zip(alone, reqs))


def test_seeded_temperature_is_reproducible_and_seed_sensitive(tiny_llada):
    llm = LLM(tiny_llada, block_length=8, dtype="float32")
    prompt = {"prompt_token_ids": [1, 2, 3, 4]}
    a = llm.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=1, ignore_eos=True))[0]
    b = llm.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=1, ignore_eos=True))[0]
    c = llm.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=2, ignore_eos=True))[0]
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids
