"""logprobs over HTTP in OpenAI's shapes: chat (`logprobs` + `top_logprobs`) and completions (`logprobs: N`), as
JSON, streamed (the chunks' tokens are the answer's, in order) and with n > 1; the openai SDK reads them; each
value is the offline API's for the same request (the forward that committed the token)."""
import json

import httpx
import pytest
from openai import OpenAI

from dllm_server import LLM, SamplingParams

BODY = {"max_tokens": 24, "ignore_eos": True, "threshold": 0.5, "return_token_ids": True}


def stream_chunks(url: str, path: str, body: dict) -> list[dict]:
    out = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


def test_chat_logprobs_equal_the_offline_ones_and_stream_in_order(server, tiny_llada):
    body = {**BODY, "messages": [{"role": "user", "content": "Hello there"}], "logprobs": True, "top_logprobs": 2}
    choice = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == len(choice["token_ids"]) == 24
    assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["logprob"] >= c["logprob"] for c in content)
    assert all(c["bytes"] == list(c["token"].encode()) for c in content)
    offline = LLM(tiny_llada, block_length=8, dtype="float32").chat(
        [{"role": "user", "content": "Hello there"}],
        SamplingParams(max_tokens=24, ignore_eos=True, threshold=0.5, logprobs=2))[0]
    assert offline.token_ids == choice["token_ids"]
    assert [c["logprob"] for c in content] == pytest.approx([lp for lp, _ in offline.logprobs], abs=1e-6)
    streamed = [c for chunk in stream_chunks(server.url, "/v1/chat/completions", body) for choice in chunk["choices"]
                for c in (choice.get("logprobs") or {"content": []})["content"]]
    assert [c["token"] for c in streamed] == [c["token"] for c in content]
    assert [c["logprob"] for c in streamed] == pytest.approx([c["logprob"] for c in content], abs=1e-9)


def test_completion_logprobs_with_n_and_the_openai_sdk(server):
    body = {**BODY, "prompt": "ROMEO.", "logprobs": 3, "n": 2, "temperature": 1.0, "seed": 4}
    choices = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"]
    for ch in choices:
        lp = ch["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 24
        assert all(len(t) <= 3 for t in lp["top_logprobs"]) and lp["text_offset"][0] == 0
        assert all(v <= 0 for v in lp["token_logprobs"])
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    sdk = client.completions.create(model="tiny", prompt="ROMEO.", max_tokens=8, logprobs=1,
                                    extra_body={"ignore_eos": True})
    assert len(sdk.choices[0].logprobs.token_logprobs) == 8
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                          logprobs=True, top_logprobs=1, extra_body={"ignore_eos": True})
    assert len(chat.choices[0].logprobs.content) == 8 and chat.choices[0].logprobs.content[0].top_logprobs
    plain = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 4}, timeout=60).json()
    assert plain["choices"][0]["logprobs"] is None
