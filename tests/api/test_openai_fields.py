"""The sampling fields people send: n samples with documented seeds (JSON and streams), top_k /
min_p over HTTP, lists of prompts, the tokenizer routes lm-evaluation-harness probes, and every
OpenAI field the server does not implement: a 400 naming it, its no-op values accepted."""
import json

import httpx
import pytest

URL = "/v1/completions"
HOT = {"prompt": "ROMEO.", "max_tokens": 12, "temperature": 1.0, "ignore_eos": True, "return_token_ids": True}


def _post(server, path, body):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_n_samples_use_seed_plus_index(server):
    out = _post(server, URL, {**HOT, "n": 3, "seed": 41})
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for i, choice in enumerate(out["choices"]):      # sample i is exactly the n=1 request with seed 41 + i
        alone = _post(server, URL, {**HOT, "seed": 41 + i})["choices"][0]
        assert choice["token_ids"] == alone["token_ids"] and choice["text"] == alone["text"]
    assert len({tuple(c["token_ids"]) for c in out["choices"]}) > 1
    one = _post(server, URL, {**HOT, "seed": 41})
    assert out["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]        # the prompt counts once
    assert out["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in out["choices"])


def test_n_with_a_list_of_prompts_orders_choices_prompt_major(server):
    out = _post(server, URL, {**HOT, "prompt": [[82, 79, 77], [72, 105, 33]], "n": 2, "seed": 7})
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] == [72, 105, 33] for c in out["choices"]] == [False, False, True, True]
    single = _post(server, URL, {**HOT, "prompt": [72, 105, 33], "seed": 8})["choices"][0]
    assert out["choices"][3]["token_ids"] == single["token_ids"]


def test_a_list_of_prompts_gives_one_choice_each(server):
    out = _post(server, URL, {"prompt": ["ROMEO.", "JULIET.", "Good morrow"], "max_tokens": 4})
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]


def test_n_in_a_chat_stream_has_every_choice_index(server):
    body = {"messages": [{"role": "user", "content": "Speak."}], "max_tokens": 12, "temperature": 1.0, "seed": 3,
            "n": 3, "ignore_eos": True}
    texts, finished = {0: "", 1: "", 2: ""}, []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    texts[c["index"]] += c["delta"].get("content") or ""
                    if c["finish_reason"]:
                        finished.append(c["index"])
    assert sorted(finished) == [0, 1, 2]
    whole = _post(server, "/v1/chat/completions", body)
    assert [texts[i] for i in range(3)] == [c["message"]["content"] for c in whole["choices"]]


def test_top_k_one_over_http_equals_greedy(server):
    greedy = _post(server, URL, {**HOT, "temperature": 0.0})["choices"][0]["token_ids"]
    assert _post(server, URL, {**HOT, "top_k": 1, "seed": 5})["choices"][0]["token_ids"] == greedy
    assert _post(server, URL, {**HOT, "min_p": 1.0, "seed": 5})["choices"][0]["token_ids"] == greedy


UNSUPPORTED = [
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "auto"),
    ("functions", [{"name": "f"}]), ("function_call", "auto"),
    ("response_format", {"type": "json_schema", "json_schema": {}}), ("response_format", {"type": "json"}),
    ("logit_bias", {"50": 5}), ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy"}),
    ("prediction", {"type": "content", "content": "x"}), ("reasoning_effort", "high"),
    ("web_search_options", {}), ("verbosity", "low"), ("store", True), ("metadata", {"k": "v"}),
    ("service_tier", "flex"), ("logprobs", 1), ("top_logprobs", 2), ("top_logprobs", 21), ("presence_penalty", 0.5),
    ("frequency_penalty", -1.0), ("stream_options", {"include_obfuscation": True}),
]
NO_OPS = {"tools": [], "tool_choice": "none", "parallel_tool_calls": True, "functions": [], "function_call": "none",
          "response_format": {"type": "text"}, "logit_bias": {}, "modalities": ["text"], "audio": None,
          "store": False, "metadata": {}, "service_tier": "auto", "logprobs": False, "top_logprobs": 0,
          "presence_penalty": 0, "frequency_penalty": 0, "user": "u1", "prompt_cache_key": "k",
          "safety_identifier": "s"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize("field,value", UNSUPPORTED, ids=[f"{f}={v!r}"[:40] for f, v in UNSUPPORTED])
def test_unsupported_chat_field_is_a_400_naming_it(server, field, value):
    body = {**CHAT, field: value, **({"stream": True} if field == "stream_options" else {})}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert field in err["message"] or err["param"] == field or field in (err["param"] or ""), err


@pytest.mark.parametrize("field,value", [("echo", True), ("logprobs", 21), ("logprobs", True), ("best_of", 3),
                                         ("suffix", " the end"), ("logit_bias", {"1": -100})])
def test_unsupported_completion_field_is_a_400_naming_it(server, field, value):
    r = httpx.post(server.url + URL, json={"prompt": "x", "max_tokens": 4, field: value}, timeout=30)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]


def test_no_op_values_of_unsupported_fields_are_accepted(server):
    assert httpx.post(server.url + "/v1/chat/completions", json={**CHAT, **NO_OPS}, timeout=30).status_code == 200
    r = httpx.post(server.url + URL, json={"prompt": "x", "max_tokens": 4, "echo": False, "best_of": 1, "suffix": "",
                                           "logprobs": None, "n": 1}, timeout=30)
    assert r.status_code == 200, r.text


def test_tokenizer_routes_lm_eval_probes(server):
    info = httpx.get(server.url + "/tokenizer_info", timeout=10).json()
    assert info["eos_token"] == "<|endoftext|>" and "chat_template" in info and info["model_max_length"] == 1024
    plain = _post(server, "/tokenize", {"prompt": "test", "add_special_tokens": False})["tokens"]
    assert plain == _post(server, "/tokenize", {"prompt": "test"})["tokens"][-len(plain):]
    assert _post(server, "/detokenize", {"tokens": plain})["prompt"] == "test"


def test_integral_floats_are_integers_as_json_schema_says(server):
    out = _post(server, URL, {"prompt": [72.0, 105], "max_tokens": 4.0, "n": 2.0, "seed": 3.0, "best_of": 1.0})
    assert len(out["choices"]) == 2 and out["usage"]["prompt_tokens"] == 2
    for field, value in (("max_tokens", 4.5), ("n", True), ("seed", "3")):
        r = httpx.post(server.url + URL, json={"prompt": "x", field: value}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
