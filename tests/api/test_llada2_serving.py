"""`dllm-server serve <a tiny LLaDA2 checkpoint>` over HTTP in every placement and at tensor-parallel size 2: all
of tests/engine/test_llada2_decoding.py's 36 requests and 6 with token editing sent at once (batched with each
other), every answer token-identical (float64) to the no-cache reference over stock parts; the progress stream lies
on the 32-wide grid and shows edits; a streamed answer under editing is never taken back."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from dllm_server.request.tokenize import Tokenizer
from tests.engine.test_llada2_decoding import CASES, RULES
from tests.engine.test_llada2_editing import PROMPTS
from tests.model import sdar_reference as ref

from .conftest import start_server
from .test_streaming import sse_events

B = 32
LAYOUTS = {"colocated-2": ("--num-workers", "2"),
           "disaggregated": ("--placement", "disaggregated", "--num-workers", "1", "--num-prefill-workers", "1"),
           "hybrid": ("--placement", "hybrid", "--num-workers", "1", "--num-prefill-workers", "1",
                      "--overflow-threshold-tokens", "30"),
           "tp2": ("--num-workers", "1", "--tensor-parallel-size", "2")}


EDITING = {"threshold": 0.7, "edit_threshold": 0.5, "max_post_edit_steps": 4}
RULES = {**RULES, "edit": EDITING}
ALL = CASES + [(p, 40, "edit", i % 2 == 0) for i, p in enumerate(PROMPTS[:6])]


@pytest.fixture(scope="module")
def reference(tiny_llada2):
    return [ref.reference_generate_plain(tiny_llada2, p, m, stop_ids=() if e else None, dtype=torch.float64,
                                         **RULES[r]) for p, m, r, e in ALL]


def _complete(url: str, i: int) -> list[int]:
    prompt, max_tokens, rule, ignore_eos = ALL[i]
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": ignore_eos, "seed": i,
            "return_token_ids": True, **RULES[rule]}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_served_answers_equal_the_reference(tiny_llada2, reference, layout, tmp_path):
    s = start_server(tiny_llada2, "--dtype", "float64", *LAYOUTS[layout], tmp_path=tmp_path)
    try:
        with ThreadPoolExecutor(len(ALL)) as pool:
            got = list(pool.map(lambda i: _complete(s.url, i), range(len(ALL))))
        assert got == reference
        if layout == "colocated-2":
            streaming_under_editing(s, tiny_llada2)
            body = {"prompt": CASES[1][0], "max_tokens": 40, "stream": True, "ignore_eos": True, "threshold": 0.7,
                    "stream_options": {"include_progress": True}}
            chunks = [json.loads(e) for e in sse_events(s, "/v1/completions", body)[:-1]]
            progress = [c["dllm"] for c in chunks if "dllm" in c]
            offset = len(CASES[1][0]) % B
            assert {(p["block_length"], p["block_offset"]) for p in progress} == {(B, offset)}
    finally:
        s.stop()


def streaming_under_editing(s, folder: str) -> None:
    """The progress stream shows positions rewritten after they were filled (text a naive stream would have sent
    and then contradicted); the text stream sends only blocks that can no longer change: every chunk extends what
    was sent, and all of it is the final answer."""
    body = {"prompt": PROMPTS[3], "max_tokens": 70, "ignore_eos": True, "seed": 3, **EDITING}
    final = httpx.post(s.url + "/v1/completions", json={**body, "return_token_ids": True}, timeout=120).json()
    chunks = map(json.loads, sse_events(s, "/v1/completions", {**body, "stream": True,
                                                               "stream_options": {"include_progress": True}})[:-1])
    progress = [c["dllm"] for c in chunks if not c["choices"]]
    filled: dict[int, int] = {}
    rewritten = 0
    for p in progress:
        edits = {pos: (old, new) for pos, old, new in p["edits"]}
        for pos, tok in zip(p["positions"], p["token_ids"]):
            if pos in edits:
                assert filled[pos] == edits[pos][0] != tok == edits[pos][1]
                rewritten += 1
            else:
                assert pos not in filled
            filled[pos] = tok
        assert p["num_committed"] == len(p["positions"]) - len(edits)
    assert rewritten > 10
    assert [filled[i] for i in range(70)] == final["choices"][0]["token_ids"]
    pieces = [c["choices"][0]["text"] for c in map(json.loads, sse_events(s, "/v1/completions",
                                                                          {**body, "stream": True})[:-1])]
    assert len([x for x in pieces if x]) >= 2                  # more than one block's worth, sent as they ended
    text = Tokenizer(folder).decode(final["choices"][0]["token_ids"])
    assert "".join(pieces) == final["choices"][0]["text"] == text


def test_the_slo_policy_chooses_this_familys_thresholds(tiny_llada2, tmp_path):
    """--threshold-policy slo on a block-causal MoE model: a loose SLO keeps the checkpoint's careful threshold, a
    tight one takes the ladder's fastest and fewer forwards; with editing the policy still sets the mask threshold
    (editing's post-edit forwards are the request's own, not predicted: docs/llada2.md)."""
    s = start_server(tiny_llada2, "--threshold-policy", "slo", tmp_path=tmp_path)
    try:
        body = {"prompt": [5, 6, 7, 8] * 10, "max_tokens": 64, "ignore_eos": True}
        loose, tight, edited = (httpx.post(s.url + "/v1/completions", json={**body, **extra}, timeout=60).json()
                                ["choices"][0]["dllm"] for extra in ({"slo_ms": 60_000}, {"slo_ms": 1},
                                                                     {"slo_ms": 1, "edit_threshold": 0.5,
                                                                      "max_post_edit_steps": 2}))
        assert min(loose["thresholds"]) > max(tight["thresholds"]) == max(edited["thresholds"])
        assert tight["forwards"] < loose["forwards"] and tight["slo_met"] is False and loose["slo_met"] is True
        assert edited["edits"] > 0 and edited["forwards"] > tight["forwards"]
    finally:
        s.stop()
