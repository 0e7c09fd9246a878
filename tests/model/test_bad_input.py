"""Bad input fails fast with a ValueError that names the field."""
import pytest

from dllm_server import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llada):
    return LLM(tiny_llada, block_length=8)


@pytest.mark.parametrize("prompt,params,field", [
    ("", SamplingParams(), "prompt"),
    ({"prompt_token_ids": []}, SamplingParams(), "prompt"),
    ({"prompt_token_ids": [1, 99999]}, SamplingParams(), "prompt_token_ids"),
    ({"prompt_token_ids": [1, -3]}, SamplingParams(), "prompt_token_ids"),
    ({"prompt_token_ids": [1, "a"]}, SamplingParams(), "prompt_token_ids"),
    ("hi", SamplingParams(max_tokens=5000), "max_tokens"),
    (42, SamplingParams(), "prompt"),
])
def test_bad_requests(llm, prompt, params, field):
    with pytest.raises(ValueError, match=field):
        llm.generate(prompt, params)


def test_steps_outside_the_blocks_range_run_the_nearest_meaningful_count(llm):
    """steps below the number of blocks take one forward a block; above the answer length, one a
    position (decoding/canvas.effective_steps)."""
    few, many = llm.generate(["hi", "hi"], [SamplingParams(max_tokens=16, steps=1, ignore_eos=True),
                                            SamplingParams(max_tokens=16, steps=17, ignore_eos=True)])
    assert few.stats.steps_per_block == [1, 1] and many.stats.steps_per_block == [8, 8]


def test_mask_token_in_prompt(llm):
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate({"prompt_token_ids": [1, llm.args.mask_id]})


@pytest.mark.parametrize("kwargs,field", [
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=2.5), "max_tokens"),
    (dict(temperature=-1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(threshold=1.5), "threshold"), (dict(factor=0), "factor"), (dict(steps=0), "steps"),
    (dict(remasking="sideways"), "remasking"), (dict(remasking="random"), "remasking"),
    (dict(seed=-1), "seed"), (dict(stop=[""]), "stop"), (dict(block_length=0), "block_length"),
    (dict(factor=1.0, steps=4), "factor"), (dict(ignore_eos="yes"), "ignore_eos"),
    (dict(top_k=-2), "top_k"), (dict(top_k=2.0), "top_k"), (dict(min_p=1.5), "min_p"), (dict(min_p=-0.1), "min_p"),
])
def test_bad_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_nothing_runs_when_one_prompt_of_a_batch_is_bad(llm):
    with pytest.raises(ValueError):
        llm.generate(["ok", ""])
    assert not llm.core.has_work
    assert llm.core.pool.num_free_pages == llm.core.pool.num_pages


def test_bad_config_values():
    from dllm_server.config import ServerConfig
    for kwargs, field in [(dict(block_length=0), "block_length"), (dict(cache="full"), "cache"),
                          (dict(token_budget=0), "token_budget"), (dict(page_size=0), "page_size")]:
        with pytest.raises(ValueError, match=field):
            ServerConfig(**kwargs)
