"""EOS / end-of-turn early stop: later blocks are never computed, and the visible text equals
the ignore_eos run truncated at the stop token."""

from dllm_server import LLM, SamplingParams


def _first_stop_block(token_ids, stop_ids, block_len):
    for i, t in enumerate(token_ids):
        if t in stop_ids:
            return i, i // block_len
    return None, None


def test_stop_token_skips_later_blocks(tiny_llada):
    llm = LLM(tiny_llada, block_length=8, dtype="float32")
    stop_ids = set(llm.stop_ids)
    calls = []
    llm.runner.model.register_forward_hook(lambda *_: calls.append(1))
    found = 0
    for seed in range(60):   # deterministic search for cases whose first stop token lands mid-answer
        prompt = {"prompt_token_ids": [seed % 250 + 1, 5, 9]}
        kw = dict(max_tokens=48, temperature=1.0, seed=seed)
        full = llm.generate(prompt, SamplingParams(ignore_eos=True, **kw))[0]
        pos, block = _first_stop_block(full.token_ids, stop_ids, 8)
        if pos is None or block >= 5:
            continue
        calls.clear()
        early = llm.generate(prompt, SamplingParams(**kw))[0]
        assert early.finish_reason == "stop"
        assert early.token_ids == full.token_ids[: pos + 1]
        assert early.text == llm.tokenizer.decode(full.token_ids[:pos])
        # Blocks after the stop token's block never ran: counted model forwards and block stats.
        assert len(calls) == early.stats.num_forwards
        assert early.stats.num_blocks_run == block + 1
        assert early.stats.num_forwards <= sum(full.stats.steps_per_block[: block + 1])
        found += 1
    assert found >= 2, "the search found too few mid-answer stop tokens to test"


def test_length_limit_skips_the_rounded_up_tail(tiny_llada):
    llm = LLM(tiny_llada, block_length=8, dtype="float32")
    out = llm.generate({"prompt_token_ids": [3, 4, 5]}, SamplingParams(max_tokens=10, ignore_eos=True, steps=16))[0]
    assert len(out.token_ids) == 10 and out.finish_reason == "length"


def test_stop_strings_cut_the_text(tiny_llada):
    llm = LLM(tiny_llada, block_length=8, dtype="float32")
    prompt = {"prompt_token_ids": [3, 4, 5]}
    full = llm.generate(prompt, SamplingParams(max_tokens=32, ignore_eos=True, temperature=1.0, seed=3))[0]
    stop = full.text[5:7]
    assert stop
    out = llm.generate(prompt, SamplingParams(max_tokens=32, ignore_eos=True, temperature=1.0, seed=3, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.find(stop)]
