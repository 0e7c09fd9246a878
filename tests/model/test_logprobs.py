"""Log-probabilities (docs/evaluation.md): each answer token's, and its top alternatives, equal a recomputation
from the logits of the very forward that committed it: bidirectional (LLaDA, Dream) and block-causal (SDAR)."""
import pytest
import torch

import dllm_server.worker.model_step as model_step
from dllm_server import LLM, SamplingParams


def capture(monkeypatch):
    """Every step's logits, rows and committed (mask, tokens), as the stepper saw them."""
    calls = []
    real = model_step.commit_step

    def spy(logits, masked, rows, mask_id, candidates=None, edits=None):
        out = real(logits, masked, rows, mask_id, candidates, edits)
        calls.append((logits.detach().clone(), rows, out[0].clone(), out[1].clone()))
        return out
    monkeypatch.setattr(model_step, "commit_step", spy)
    return calls


@pytest.mark.parametrize("arch", ["llada", "dream", "sdar"])
def test_logprobs_equal_the_committing_forwards_distribution(request, monkeypatch, arch):
    path = request.getfixturevalue(f"tiny_{arch}")
    calls = capture(monkeypatch)
    llm = LLM(path, block_length=8, dtype="float64")
    params = SamplingParams(max_tokens=16, ignore_eos=True, logprobs=3, threshold=0.3)
    prompt = [5, 9, 14, 3, 7]
    [out] = llm.generate([{"prompt_token_ids": prompt}], params)
    assert len(out.logprobs) == len(out.token_ids) == 16
    mask_id = llm.model_info.mask_id
    expected = {}                       # answer position -> (token, the committing forward's log-softmax row)
    for logits, rows, commit, tokens in calls:
        [row] = rows
        start = row.params.block_bounds(len(prompt), row.block_index)[0]
        lp = torch.log_softmax(logits[0].double().masked_fill(
            torch.arange(logits.shape[-1]) == mask_id, float("-inf")), dim=-1)
        for col in commit[0].nonzero().flatten().tolist():
            expected[start + col - len(prompt)] = (int(tokens[0, col]), lp[col])
    for i, (tok, (logprob, alternatives)) in enumerate(zip(out.token_ids, out.logprobs)):
        want_tok, row = expected[i]
        assert tok == want_tok and logprob == pytest.approx(float(row[tok]), abs=1e-9)
        top = row.topk(3)
        assert [t for t, _ in alternatives] == top.indices.tolist()
        assert [v for _, v in alternatives] == pytest.approx(top.values.tolist(), abs=1e-9)
    for tok, (logprob, alternatives) in zip(out.token_ids, out.logprobs):
        assert len(alternatives) == 3
        values = [v for _, v in alternatives]
        assert values == sorted(values, reverse=True) and values[0] >= logprob - 1e-12
        assert all(t != mask_id for t, _ in alternatives)


def test_without_logprobs_nothing_is_computed_and_the_answer_is_the_same(tiny_llada, monkeypatch):
    llm = LLM(tiny_llada, block_length=8, dtype="float64")
    p = SamplingParams(max_tokens=16, ignore_eos=True)
    plain = llm.generate([{"prompt_token_ids": [4, 5, 6]}], p)[0]
    asked = llm.generate([{"prompt_token_ids": [4, 5, 6]}], SamplingParams(max_tokens=16, ignore_eos=True,
                                                                           logprobs=0))[0]
    assert plain.logprobs is None and plain.token_ids == asked.token_ids
    assert all(len(alt) == 0 and lp <= 0 for lp, alt in asked.logprobs)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
