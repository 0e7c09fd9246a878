"""Token editing (LLaDA2.1) and LLaDA2.0 threshold decoding on a tiny LLaDA2 checkpoint, float64, greedy: the engine
(offline, all requests batched) equals the plain no-cache loop of tests/model/sdar_reference.py (LLaDA2.1's own
generate), and both are held to diffusers' LLaDA2Pipeline driven over the same weights: equal without editing, and
equal under editing once the loop follows the pipeline's two departures (that module's docstring, 6 and 7), which
change most answers of this tiny model (its edits rarely settle, so blocks run to the post-edit budget)."""
from __future__ import annotations

import random

import pytest
import torch

from dllm_server.decoding.params import SamplingParams
from dllm_server.llm import LLM
from tests.model import sdar_reference as ref

pytest.importorskip("diffusers")
RULES = {"t0.95": {"threshold": 0.95}, "t0.7+edit0.5": {"threshold": 0.7, "edit_threshold": 0.5},
         "t0.5": {"threshold": 0.5}}


def prompts() -> list[list[int]]:
    """20 prompts of 3-70 byte tokens: first answer blocks of 2 to 32 masks."""
    rng = random.Random(5)
    return [[rng.randrange(0, 256) for _ in range(rng.randrange(3, 70))] for _ in range(20)]


PROMPTS = prompts()
MAX_TOKENS = 40                   # >= the block: the pipeline's step cap is the block's (docstring, 3)


def stops(i: int):
    return () if i % 2 == 0 else None            # even prompts ignore EOS


def plain(folder, i, rule, **kw):
    return ref.reference_generate_plain(folder, PROMPTS[i], MAX_TOKENS, stop_ids=stops(i), dtype=torch.float64,
                                        **RULES[rule], **kw)


@pytest.fixture(scope="module")
def loop(tiny_llada2):
    """(answers, edits per request) of the plain loop, by rule."""
    out = {}
    for rule in RULES:
        answers, edits = [], []
        for i in range(len(PROMPTS)):
            e: list = []
            answers.append(plain(tiny_llada2, i, rule, **({"edits": e} if "edit" in rule else {})))
            edits.append(len(e))
        out[rule] = answers, edits
    return out


def test_engine_equals_the_plain_loop_with_and_without_editing(tiny_llada2, loop):
    llm = LLM(tiny_llada2, dtype="float64")
    cases = [(rule, i) for rule in RULES for i in range(len(PROMPTS))]
    outs = llm.generate([{"prompt_token_ids": PROMPTS[i]} for _, i in cases],
                        [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=i % 2 == 0, **RULES[rule])
                         for rule, i in cases])
    for (rule, i), o in zip(cases, outs):
        assert o.token_ids == loop[rule][0][i], (rule, i)
        assert o.stats.num_edits == loop[rule][1][i], (rule, i)
    edited = [o for (rule, _), o in zip(cases, outs) if "edit" in rule]
    assert sum(o.stats.num_edits for o in edited) > 1000 and all(o.stats.num_edits > 0 for o in edited)


@pytest.mark.parametrize("rule", ["t0.95", "t0.5"])
def test_without_editing_the_pipeline_agrees(tiny_llada2, loop, rule):
    assert all(ref.diffusers_coincides(len(p), MAX_TOKENS, 32) for p in PROMPTS)
    got = [ref.reference_generate(tiny_llada2, p, MAX_TOKENS, stop_ids=stops(i), dtype=torch.float64, **RULES[rule])
           for i, p in enumerate(PROMPTS)]
    assert got == loop[rule][0]


@pytest.mark.parametrize("budget", [16, 2, 0])
def test_with_editing_the_pipeline_agrees_up_to_its_two_departures(tiny_llada2, loop, budget):
    rule = "t0.7+edit0.5"
    pipe = [ref.reference_generate(tiny_llada2, p, MAX_TOKENS, stop_ids=stops(i), dtype=torch.float64,
                                   max_post_edit_steps=budget, **RULES[rule]) for i, p in enumerate(PROMPTS)]
    quirks = [plain(tiny_llada2, i, rule, max_post_edit_steps=budget, pipeline_quirks=True)
              for i in range(len(PROMPTS))]
    assert pipe == quirks
    ours = loop[rule][0] if budget == 16 else [plain(tiny_llada2, i, rule, max_post_edit_steps=budget)
                                               for i in range(len(PROMPTS))]
    assert sum(a != b for a, b in zip(ours, pipe)) >= 10         # the departures are real on this model


def test_the_post_edit_budget_bounds_a_blocks_forwards(tiny_llada2):
    """Per block: at most one forward per masked position to fill it, then at most max_post_edit_steps with no
    mask left (budget 0: edits only while masks remain); the engine equals the loop at every budget."""
    llm = LLM(tiny_llada2, dtype="float64")
    for budget in (0, 1, 3):
        params = [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=i % 2 == 0, threshold=0.7, edit_threshold=0.5,
                                 max_post_edit_steps=budget) for i in range(6)]
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:6]], params)
        over = 0
        for i, o in enumerate(outs):
            assert o.token_ids == plain(tiny_llada2, i, "t0.7+edit0.5", max_post_edit_steps=budget), (budget, i)
            masked = [32 - len(PROMPTS[i]) % 32] + [32] * (len(o.stats.steps_per_block) - 1)
            assert all(s <= m + budget for s, m in zip(o.stats.steps_per_block, masked))
            over += sum(s > m for s, m in zip(o.stats.steps_per_block, masked))
        assert (over > 0) == (budget > 0)          # post-edit forwards ran exactly when the budget allowed them
