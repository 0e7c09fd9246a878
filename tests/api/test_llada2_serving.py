"""`dllm-server serve <a tiny LLaDA2 checkpoint>` over HTTP in every placement and at tensor-parallel size 2: all
of tests/engine/test_llada2_decoding.py's 36 requests sent at once (batched with each other), every answer
token-identical (float64) to the no-cache reference over stock parts; the progress stream lies on the 32-wide grid."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from tests.engine.test_llada2_decoding import CASES, RULES
from tests.model import sdar_reference as ref

from .conftest import start_server
from .test_streaming import sse_events

B = 32
LAYOUTS = {"colocated-2": ("--num-workers", "2"),
           "disaggregated": ("--placement", "disaggregated", "--num-workers", "1", "--num-prefill-workers", "1"),
           "hybrid": ("--placement", "hybrid", "--num-workers", "1", "--num-prefill-workers", "1",
                      "--overflow-threshold-tokens", "30"),
           "tp2": ("--num-workers", "1", "--tensor-parallel-size", "2")}


@pytest.fixture(scope="module")
def reference(tiny_llada2):
    return [ref.reference_generate_plain(tiny_llada2, p, m, stop_ids=() if e else None, dtype=torch.float64,
                                         **RULES[r]) for p, m, r, e in CASES]


def _complete(url: str, i: int) -> list[int]:
    prompt, max_tokens, rule, ignore_eos = CASES[i]
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": ignore_eos, "seed": i,
            "return_token_ids": True, **RULES[rule]}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_served_answers_equal_the_reference(tiny_llada2, reference, layout, tmp_path):
    s = start_server(tiny_llada2, "--dtype", "float64", *LAYOUTS[layout], tmp_path=tmp_path)
    try:
        with ThreadPoolExecutor(len(CASES)) as pool:
            got = list(pool.map(lambda i: _complete(s.url, i), range(len(CASES))))
        assert got == reference
        if layout == "colocated-2":
            body = {"prompt": CASES[1][0], "max_tokens": 40, "stream": True, "ignore_eos": True, "threshold": 0.7,
                    "stream_options": {"include_progress": True}}
            chunks = [json.loads(e) for e in sse_events(s, "/v1/completions", body)[:-1]]
            progress = [c["dllm"] for c in chunks if "dllm" in c]
            offset = len(CASES[1][0]) % B
            assert {(p["block_length"], p["block_offset"]) for p in progress} == {(B, offset)}
    finally:
        s.stop()
