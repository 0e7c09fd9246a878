"""Every bad body is a 400 naming the field (never 422 or 500); auth, unknown model, bad JSON."""
import httpx
import pytest

from .conftest import start_server

GOOD_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

BAD_CHAT_FIELDS = [
    ("messages", []), ("messages", "hello"), ("messages", [{"role": "wizard", "content": "x"}]),
    ("max_tokens", 0), ("max_tokens", "ten"), ("max_tokens", 10 ** 6), ("max_completion_tokens", -1),
    ("temperature", -0.5), ("temperature", "hot"), ("top_p", 0), ("top_p", 1.5), ("seed", -1),
    ("seed", 2 ** 64), ("stop", 5), ("stop", [""]), ("n", 0), ("n", 129), ("logprobs", 1), ("top_logprobs", 3),
    ("presence_penalty", 0.5), ("frequency_penalty", 1.0), ("block_length", 0), ("threshold", 2),
    ("factor", 0), ("steps", 0), ("steps", 10 ** 7), ("remasking", "sideways"), ("remasking", "random"),
    ("stream", "yes"), ("top_k", -2), ("top_k", 1.5), ("min_p", 1.5), ("min_p", -0.1),
    ("stream_options", {"include_usage": True}), ("ignore_eos", "maybe"), ("return_token_ids", []),
    ("entropy_bound", -0.1), ("entropy_bound", "low"), ("edit_threshold", 0), ("edit_threshold", 1.5),
    ("edit_threshold", "high"), ("max_post_edit_steps", -1), ("max_post_edit_steps", 257),
    ("max_post_edit_steps", 2.5),
]


@pytest.mark.parametrize("field,value", BAD_CHAT_FIELDS, ids=[f"{f}={v!r}"[:40] for f, v in BAD_CHAT_FIELDS])
def test_bad_chat_field_is_400_naming_it(server, field, value):
    r = httpx.post(server.url + "/v1/chat/completions", json={**GOOD_CHAT, field: value}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert field in err["message"] or field == err["param"], err
    assert "/work" not in err["message"] and "Traceback" not in err["message"]


@pytest.mark.parametrize("body,field", [
    ({"prompt": ""}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": [1, 10 ** 7]}, "prompt_token_ids"),
    ({"prompt": [[]]}, "prompt"), ({"prompt": 3}, "prompt"), ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "max_tokens": 2000}, "max_tokens"),
    ({"prompt": "x", "entropy_bound": 0.5, "factor": 1.0}, "entropy_bound"),
    ({"prompt": "x", "max_post_edit_steps": 3}, "max_post_edit_steps"),
    ({"prompt": "x", "edit_threshold": 0.5, "response_format": {"type": "json_object"}}, "edit_threshold"),
])
def test_bad_completion_bodies(server, body, field):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]


def test_not_json_and_not_an_object(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{nope", timeout=10)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json=[1, 2], timeout=10)
    assert r.status_code == 400


def test_unknown_model_is_404(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={**GOOD_CHAT, "model": "gpt-9"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


def test_unknown_fields_are_ignored(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={**GOOD_CHAT, "flavour": "vanilla"}, timeout=30)
    assert r.status_code == 200


def test_entropy_bound_is_a_valid_rule(server):
    body = {"prompt": "x", "max_tokens": 8, "entropy_bound": 0.5, "return_token_ids": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text


def test_unknown_route_and_method(server):
    assert httpx.get(server.url + "/v2/nothing", timeout=10).json()["error"]["code"] == 404
    assert httpx.get(server.url + "/v1/chat/completions", timeout=10).status_code == 405


def test_request_id_is_echoed(server):
    r = httpx.post(server.url + "/v1/chat/completions", json=GOOD_CHAT, headers={"X-Request-Id": "abc123"},
                   timeout=30)
    assert r.headers["x-request-id"] == "abc123" and r.json()["id"] == "chatcmpl-abc123"


def test_api_key(tiny_llada, tmp_path):
    s = start_server(tiny_llada, "--block-length", "8", tmp_path=tmp_path, env={"DLLM_API_KEY": "sekret"})
    try:
        url = s.url + "/v1/chat/completions"
        assert httpx.post(url, json=GOOD_CHAT, timeout=30).status_code == 401
        r = httpx.post(url, json=GOOD_CHAT, headers={"Authorization": "Bearer wrong"}, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
        assert httpx.post(url, json=GOOD_CHAT, headers={"Authorization": "Bearer sekret"}, timeout=30).status_code == 200
        assert httpx.get(s.url + "/health", timeout=30).status_code == 200      # open
        assert httpx.get(s.url + "/metrics", timeout=30).status_code == 200
    finally:
        s.stop()


@pytest.mark.parametrize("steps,want", [(1, [1, 1, 1]), (10 ** 5, [8, 8, 8]), (5, [2, 2, 1])])
def test_any_steps_in_the_schema_is_served_one_to_block_len_forwards_a_block(server, steps, want):
    """`steps` is a budget over the whole answer, taken as at least one forward per block and at
    most one per position (docs/decoding.md): 3 blocks of 8 here."""
    body = {"prompt": [6, 7, 8], "max_tokens": 24, "steps": steps, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["dllm"]["steps_per_block"] == want
