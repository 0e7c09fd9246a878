"""`dllm-server serve <a tiny SDAR checkpoint>` end to end: the OpenAI API, a progress stream whose
geometry is the model's absolute block grid, a clear 400 for a block length the model was not
trained with, prefix-cache hits on /metrics, and the playground drawing the blocks where they are
(a real browser, when Playwright and Chromium are there)."""
from __future__ import annotations

import json

import httpx
import pytest

from .conftest import start_server
from .test_lifecycle import metric
from .test_streaming import sse_events

B = 4                                     # the tiny checkpoint's block_size


@pytest.fixture(scope="module")
def sdar_server(tiny_sdar, tmp_path_factory):
    s = start_server(tiny_sdar, "--served-model-name", "sdar", "--num-workers", "1",
                     tmp_path=tmp_path_factory.mktemp("sdar"))
    yield s
    s.stop()


def test_completion_and_chat(sdar_server):
    r = httpx.post(sdar_server.url + "/v1/completions", timeout=60,
                   json={"model": "sdar", "prompt": "To be, or not", "max_tokens": 10, "ignore_eos": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert r.json()["usage"]["completion_tokens"] == 10
    assert choice["dllm"]["block_length"] == B and sum(choice["dllm"]["steps_per_block"]) == choice["dllm"]["forwards"]
    r = httpx.post(sdar_server.url + "/v1/chat/completions", timeout=60,
                   json={"model": "sdar", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_other_block_length_is_a_400(sdar_server):
    r = httpx.post(sdar_server.url + "/v1/completions", timeout=30,
                   json={"prompt": "a", "max_tokens": 8, "block_length": 8})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "block_length" and "own blocks of 4" in err["message"] and err["type"] == "BadRequestError"


@pytest.mark.parametrize("prompt_len", [5, 8])
def test_progress_stream_lies_on_the_absolute_block_grid(sdar_server, prompt_len):
    """Blocks start at multiples of 4 from position 0: the first answer block holds the prompt's
    tail (block_offset), every forward commits inside its own block, the canvas ends on the grid."""
    body = {"prompt": list(range(10, 10 + prompt_len)), "max_tokens": 9, "stream": True, "ignore_eos": True,
            "threshold": 0.6, "stream_options": {"include_progress": True}}
    chunks = [json.loads(e) for e in sse_events(sdar_server, "/v1/completions", body)[:-1]]
    progress = [c["dllm"] for c in chunks if "dllm" in c]
    offset = prompt_len % B
    answer_len = -(-(prompt_len + 9) // B) * B - prompt_len
    assert {(p["block_length"], p["block_offset"], p["answer_len"]) for p in progress} == {(B, offset, answer_len)}
    for p in progress:
        lo, hi = p["block"] * B - offset, (p["block"] + 1) * B - offset
        assert all(max(0, lo) <= q < hi for q in p["positions"]), p
    masked = [p["masked"] for p in progress]
    assert masked == sorted(masked, reverse=True) and masked[-1] <= answer_len - 9   # only the tail may stay
    final = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][0]
    assert final["dllm"]["blocks"] == (prompt_len + 9 + B - 1) // B - prompt_len // B


def test_prefix_cache_hits_are_on_metrics(sdar_server):
    before = metric(sdar_server, "dllm:prefix_cache_hits_total") or 0.0
    prompt = list(range(1, 120))
    outs = [httpx.post(sdar_server.url + "/v1/completions", timeout=60,
                       json={"prompt": prompt, "max_tokens": 6, "ignore_eos": True, "seed": 3}).json()
            for _ in range(2)]
    assert outs[0]["choices"][0]["text"] == outs[1]["choices"][0]["text"]
    hits = metric(sdar_server, "dllm:prefix_cache_hits_total") - before
    assert hits == (116 // 16) * 16           # the complete prompt blocks, in whole 16-token pages
    assert metric(sdar_server, "dllm:prefix_cache_pages") >= 7


def test_playground_info_offers_the_models_block(sdar_server):
    info = httpx.get(sdar_server.url + "/playground/info", timeout=10).json()
    assert info["defaults"]["block_length"] == B and info["ready"] is True


def test_playground_draws_the_absolute_grid_in_a_browser(sdar_server):
    from .test_playground import CHROMIUM_FLAGS, _browser, fill, send
    sync_playwright, exe = _browser()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(sdar_server.url + "/playground")
        page.wait_for_selector('#server-status:has-text("ready")')
        assert page.input_value("#block_length") == str(B)
        prompt = "abcdefg"                    # 7 byte tokens (+ BOS, if any): a partial first block
        fill(page, "completion", max_tokens=10, threshold=0.5, seed=1)
        page.fill("#prompt", prompt)
        page.check("#ignore_eos")
        send(page, "done")
        rows = page.locator("#canvas .block")
        cells = [rows.nth(i).locator(".cell").count() for i in range(rows.count())]
        assert page.locator("#canvas .cell.masked").count() == 0
        # the first row holds only the answer part of its block, every other a whole block
        offset = B - cells[0]                 # prompt positions in the first block
        assert 1 <= cells[0] <= B and all(c == B for c in cells[1:]) and (offset + sum(cells)) % B == 0
        assert not errors, errors
        browser.close()
