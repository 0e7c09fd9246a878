"""top_k and min_p through the whole engine: top_k=1 at temperature 1 commits exactly what greedy
commits (the filters choose tokens, confidence stays the model's own), min_p changes sampled
answers (min_p=1 is greedy, min_p=0 changes nothing), and mixed settings stay batch-invariant."""
import pytest

from dllm_server import LLM, SamplingParams

PROMPTS = [{"prompt_token_ids": [1, 2, 3, 4]}, {"prompt_token_ids": [40, 41, 42, 43, 44]}, "ROMEO. But soft,"]


@pytest.fixture(scope="module")
def llm(tiny_llada):
    return LLM(tiny_llada, block_length=8, dtype="float32")


def _tokens(llm, **kw):
    return [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True, **kw))]


def test_top_k_one_equals_greedy(llm):
    greedy = _tokens(llm)
    assert _tokens(llm, temperature=1.0, top_k=1, seed=3) == greedy
    assert _tokens(llm, temperature=1.0, seed=3) != greedy            # without top_k it does sample
    assert _tokens(llm, temperature=1.0, top_k=-1, seed=3) == _tokens(llm, temperature=1.0, seed=3)   # -1: off


def test_min_p_changes_sampled_answers_where_it_should(llm):
    free = _tokens(llm, temperature=1.5, seed=11)
    assert _tokens(llm, temperature=1.5, seed=11, min_p=0.0) == free
    assert _tokens(llm, temperature=1.5, seed=11, min_p=1.0) == _tokens(llm)        # only the best survives
    assert _tokens(llm, temperature=1.5, seed=11, min_p=0.3) != free


def test_mixed_filters_are_batch_invariant(llm):
    settings = [dict(top_k=3), dict(min_p=0.2), dict(top_k=5, top_p=0.9, min_p=0.05), dict(), dict(top_k=1)]
    reqs = [(PROMPTS[i % 3], SamplingParams(max_tokens=16, ignore_eos=True, temperature=1.2, seed=20 + i, **kw))
            for i, kw in enumerate(settings)]
    alone = [llm.generate([p], sp)[0].token_ids for p, sp in reqs]
    assert [o.token_ids for o in llm.generate([p for p, _ in reqs], [sp for _, sp in reqs])] == alone
