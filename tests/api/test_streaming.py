"""SSE details: progress chunks, the [DONE] terminator, text never showing masked positions."""
import json

import httpx


def sse_events(server, path, body):
    events = []
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    return events


def test_progress_stream_masked_counts_fall_and_canvas_ends_as_text(server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 24, "stream": True, "seed": 1,
            "temperature": 0.7, "ignore_eos": True,
            "stream_options": {"include_progress": True, "include_usage": True}}
    events = sse_events(server, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    progress = [c["dllm"] for c in chunks if "dllm" in c]
    assert all(c["choices"] == [] for c in chunks if "dllm" in c)
    masked = [p["masked"] for p in progress]
    assert masked == sorted(masked, reverse=True) and len(set(masked)) == len(masked)   # strictly decreasing
    assert masked[-1] == 0
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))
    assert progress[-1]["canvas"] == text
    assert all("\u2591" not in (c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))
    assert chunks[-1]["usage"]["completion_tokens"] == 24


def test_progress_chunks_name_their_tokens_and_the_final_chunk_sums_up(server):
    body = {"prompt": [5, 6, 7], "max_tokens": 20, "stream": True, "seed": 4, "temperature": 0.9,
            "ignore_eos": True, "threshold": 0.5, "stream_options": {"include_progress": True}}
    chunks = [json.loads(e) for e in sse_events(server, "/v1/completions", body)[:-1]]
    progress = [c["dllm"] for c in chunks if "dllm" in c]
    ids = set()
    for p in progress:
        assert len(p["positions"]) == len(p["token_ids"]) == len(p["tokens"]) == p["num_committed"]
        assert (p["block_length"], p["answer_len"]) == (8, 24)          # 20 rounded up to whole blocks
        ids.update(p["token_ids"])
    for tid in sorted(ids)[:4]:        # each token's own text, special tokens by name
        text = httpx.post(server.url + "/detokenize", json={"tokens": [tid]}, timeout=10).json()["prompt"]
        assert all(t == text for p in progress for i, t in zip(p["token_ids"], p["tokens"]) if i == tid)
    final = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    summary = final[0]["dllm"]
    assert summary["forwards"] == len(progress) == sum(summary["steps_per_block"])
    assert summary["block_length"] == 8 and summary["blocks"] == 3
    assert summary["thresholds"] == [0.5] * 3
    plain = httpx.post(server.url + "/v1/completions", json={k: v for k, v in body.items()
                                                             if k not in ("stream", "stream_options")},
                       timeout=60).json()["choices"][0]["dllm"]
    assert plain == summary                                            # same seed, same figures


def test_plain_stream_has_no_progress_and_role_comes_with_first_text(server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16, "stream": True}
    chunks = [json.loads(e) for e in sse_events(server, "/v1/chat/completions", body)[:-1]]
    assert all(c["choices"] for c in chunks) and not any("dllm" in c for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(1 for c in chunks if c["choices"][0]["finish_reason"]) == 1


def test_multi_prompt_completion_streams_every_choice(server):
    body = {"prompt": ["a", "b", "c"], "max_tokens": 8, "stream": True, "ignore_eos": True}
    chunks = [json.loads(e) for e in sse_events(server, "/v1/completions", body)[:-1]]
    finished = {c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]}
    assert finished == {0, 1, 2}


def test_stop_string_is_never_streamed(server):
    base = {"prompt": [5, 6, 7], "max_tokens": 24, "seed": 2, "temperature": 1.0, "ignore_eos": True}
    full = httpx.post(server.url + "/v1/completions", json=base, timeout=60).json()["choices"][0]["text"]
    stop = full[6:8]
    events = sse_events(server, "/v1/completions", {**base, "stream": True, "stop": [stop]})
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == full[: full.find(stop)]
