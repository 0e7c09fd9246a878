"""cache=none with the fixed-steps schedule equals LLaDA's reference loop, token for token."""
import pytest

from dllm_server import LLM, SamplingParams
from dllm_server.model.loader import load_model

from .oracles import reference_generate

PROMPTS = [[72, 101, 108, 108, 111], [84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114, 111, 119, 110],
           [65] * 3]


@pytest.mark.parametrize("steps,answer_len,block_len", [(24, 24, 8), (12, 24, 8), (6, 32, 16)])
def test_none_cache_fixed_steps_equals_reference(tiny_model, steps, answer_len, block_len):
    model, _, _ = load_model(tiny_model, dtype="float32")
    llm = LLM(tiny_model, cache="none", block_length=block_len, dtype="float32")
    params = SamplingParams(max_tokens=answer_len, steps=steps, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for prompt, out in zip(PROMPTS, outs):
        expected = reference_generate(model, prompt, answer_len, block_len, steps)
        assert out.token_ids == expected
        assert out.stats.num_forwards == steps
        assert out.finish_reason == "length"
