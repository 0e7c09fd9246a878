"""Pure pieces: SSE decoding, chunk handling, request bodies, stats, metrics parsing, workloads."""
from __future__ import annotations

import json

import numpy as np
import pytest

from loadgen.client import RequestResult, SSEDecoder, build_body, error_message, handle_event
from loadgen.metrics_scrape import deltas, parse_cumulative, server_root
from loadgen.stats import (describe_ms, meets_slo, parse_goodput, peak_concurrency,
                           peak_output_rate, summarize, tpot)
from loadgen.tokens import TokenCounter, load_counter
from loadgen.workload import (RequestSpec, WorkloadOptions, build_workload, fit_lengths,
                              lognormal_lengths, preset_lengths)


def feed_all(lines):
    dec, out = SSEDecoder(), []
    for line in lines:
        ev = dec.feed(line)
        if ev:
            out.append(ev)
    tail = dec.flush()
    return out + ([tail] if tail else [])


def test_sse_decoder():
    events = feed_all([": keep-alive", "", "data: {\"a\": 1}", "", "data:{\"b\":", "data: 2}\r",
                       "", "event: error", "data: {\"error\": \"x\"}", "", "data: [DONE]"])
    assert events == [("", '{"a": 1}'), ("", '{"b":\n2}'), ("error", '{"error": "x"}'),
                      ("", "[DONE]")]


def test_handle_event_skips_empty_choices():
    r = RequestResult(index=0, prompt_len=3, expected_output_len=4)
    assert not handle_event(r, "", json.dumps({"choices": [], "dllm": {"step": 0}}), 0.01)
    assert r.ttft is None and r.progress_chunks == 1
    handle_event(r, "", json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
                 0.02)
    assert r.ttft is None
    handle_event(r, "", json.dumps({"choices": [{"delta": {"content": "Hi"}}]}), 0.10)
    handle_event(r, "", json.dumps({"choices": [], "dllm": {"step": 2}}), 0.12)
    last = {"choices": [{"text": " there", "finish_reason": "stop"}]}
    handle_event(r, "", json.dumps(last), 0.25)
    handle_event(r, "", json.dumps({"choices": [], "usage": {"prompt_tokens": 3,
                                                             "completion_tokens": 2}}), 0.26)
    assert handle_event(r, "", "[DONE]", 0.27)
    assert r.ttft == 0.10 and r.itls == pytest.approx([0.15]) and r.text == "Hi there"
    assert r.progress_chunks == 2 and r.empty_chunks == 1
    assert r.usage_output_tokens == 2 and r.usage_prompt_tokens == 3 and r.finish_reason == "stop"
    with pytest.raises(RuntimeError, match="boom"):
        handle_event(r, "", json.dumps({"error": {"message": "boom"}}), 0.3)


def test_build_body_and_errors():
    spec = RequestSpec([1, 2, 3], 3, 7)
    body = build_body(spec, "completions", "m", True, {"threshold": 0.8, "block_length": 8}, 0.0)
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 7 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    assert body["threshold"] == 0.8 and body["model"] == "m" and body["temperature"] == 0.0
    merged = build_body(spec, "completions", None, False,
                        {"stream_options": {"include_progress": True}})
    assert merged["stream_options"] == {"include_usage": True, "include_progress": True}
    chat = build_body(RequestSpec("hello", 1, 2), "chat", None, False, None)
    assert chat["messages"] == [{"role": "user", "content": "hello"}] and "model" not in chat
    with pytest.raises(ValueError):
        build_body(spec, "chat", None, False, None)
    raw = json.dumps({"error": {"message": "too long", "type": "invalid_request_error"}}).encode()
    assert error_message(400, raw) == "HTTP 400: too long"
    assert error_message(502, b"Bad Gateway") == "HTTP 502: Bad Gateway"


def _res(i, start, ttft, lat, tokens, ok=True, chunks=None):
    r = RequestResult(index=i, prompt_len=10, expected_output_len=tokens, start=start, ok=ok,
                      ttft=ttft, latency=lat, usage_output_tokens=tokens, text="x" * tokens)
    r.chunk_times = chunks or [ttft]
    r.chunk_chars = [1] * len(r.chunk_times)
    if not ok:
        r.error = "HTTP 400: bad"
    return r


def test_stats():
    a = _res(0, 0.0, 0.1, 1.1, 11, chunks=[0.1, 0.6, 1.1])
    b = _res(1, 0.5, 0.2, 1.2, 1)
    c = _res(2, 0.6, None, 0.01, 0, ok=False)
    assert tpot(a) == pytest.approx(0.1) and tpot(b) is None and tpot(c) is None
    assert peak_concurrency([a, b, c]) == 3
    assert peak_concurrency([_res(0, 0, .1, 1.0, 2), _res(1, 1.0, .1, 1.0, 2)]) == 1
    # a: 11 tokens over 3 chunks in buckets 0, 0, 1 -> bucket 0 gets 7.33 + b's 1 token
    assert peak_output_rate([a, b]) == pytest.approx(11 * 2 / 3 + 1)
    d = describe_ms([0.1, 0.2, None, 0.3])
    assert d["count"] == 3 and d["median"] == pytest.approx(200) and d["max"] == pytest.approx(300)
    slos = parse_goodput(["ttft:150", "tpot:200"])
    assert slos == {"ttft": 150.0, "tpot": 200.0}
    assert meets_slo(a, slos) and not meets_slo(b, slos) and not meets_slo(c, slos)
    with pytest.raises(ValueError):
        parse_goodput(["latency:3"])
    s = summarize([a, b, c], 2.0, slos, TokenCounter())
    assert (s["completed"], s["failed"], s["total_output_tokens"]) == (2, 1, 12)
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 6.0
    assert s["achieved_concurrency"] == pytest.approx((1.1 + 1.2 + 0.01) / 2.0)
    assert s["goodput"]["good_requests"] == 1 and s["goodput"]["fraction"] == pytest.approx(1 / 3)
    assert s["inter_chunk_ms"]["count"] == 0       # itls were not filled in these fakes


def test_metrics_parsing():
    text = ("# TYPE dllm:requests counter\ndllm:requests_total 5\n"
            "# TYPE dllm:step_seconds histogram\n"
            'dllm:step_seconds_bucket{le="1.0"} 2\ndllm:step_seconds_bucket{le="+Inf"} 3\n'
            "dllm:step_seconds_count 3\ndllm:step_seconds_sum 1.5\n"
            "# TYPE dllm:running gauge\ndllm:running 2\n"
            "# TYPE vllm:x counter\nvllm:x_total 1\n")
    got = parse_cumulative(text)
    assert got == {"dllm:requests_total": 5.0, "dllm:step_seconds_count": 3.0,
                   "dllm:step_seconds_sum": 1.5}
    assert deltas({"dllm:requests_total": 2.0}, got)["dllm:requests_total"] == 3.0
    assert server_root("http://h:1/v1/") == "http://h:1"
    assert server_root("http://h:1") == "http://h:1"


def test_token_counter_heuristic_and_file(tmp_path):
    c = TokenCounter()
    assert c.count("") == 0 and c.count("abcdefgh") == 2 and c.method == "chars/4"
    assert not c.mismatch(10, 12) and c.mismatch(10, 40) and not c.mismatch(3, None)
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    tok = tokenizers.Tokenizer(models.WordLevel({f"w{i}": i for i in range(50)} | {"[UNK]": 50},
                                                unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    exact = load_counter(str(path))
    assert exact.exact and exact.count("w1 w2 w3 ") == 3
    assert exact.mismatch(3, 4) and not exact.mismatch(3, 3)
    assert load_counter(str(tmp_path)).count("w1 w2") == 2     # a folder with tokenizer.json


def test_workloads(tmp_path):
    rng = np.random.default_rng(0)
    x = lognormal_lengths(100.0, 0.5, 20000, rng)
    assert np.median(x) == pytest.approx(100, rel=0.03) and x.min() >= 1
    p, o = preset_lengths("arxiv", 5000, rng, scale=0.1)
    assert np.median(p) == pytest.approx(282.7, rel=0.05)
    assert np.median(o) == pytest.approx(16.2, rel=0.1)
    assert fit_lengths(900, 300, 512) == (212, 300) and fit_lengths(5, 900, 512) == (1, 511)
    counter = TokenCounter()
    ids = build_workload(20, rng, counter, WorkloadOptions(dataset="random", vocab_size=100,
                                                            id_low=10, length_scale=0.05))
    assert all(isinstance(s.prompt, list) and len(s.prompt) == s.prompt_len for s in ids)
    assert all(10 <= t < 100 for s in ids for t in s.prompt)
    mix = build_workload(200, rng, counter, WorkloadOptions(dataset="arxiv-mix",
                                                            length_scale=0.1, max_model_len=512))
    kinds = [s.meta["kind"] for s in mix]
    assert 20 < kinds.count("short") < 80
    summaries = [s for s in mix if s.meta["kind"] == "summary"]
    assert all(s.prompt.endswith("Summarize the paper above in a short abstract.")
               for s in summaries)
    assert np.median([s.prompt_len for s in summaries]) > 5 * np.median(
        [s.output_len for s in summaries])
    assert all(s.prompt_len + s.output_len <= 512 + 16 for s in mix)
    share = tmp_path / "share.json"
    share.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "tell me about the sea " * 3},
                           {"from": "gpt", "value": "the sea is large and deep " * 4}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "ok"}]}]))
    specs = build_workload(3, rng, counter, WorkloadOptions(dataset="sharegpt",
                                                            dataset_path=str(share)))
    assert len(specs) == 3 and all(s.prompt.startswith("tell me") for s in specs)
    assert specs[0].output_len == counter.count("the sea is large and deep " * 4)


def test_per_request_slo_is_sent_judged_and_summarised():
    from loadgen.client import RequestResult, build_body, handle_event, request_slo_ms
    from loadgen.stats import meets_slo, slo_summary
    from loadgen.workload import RequestSpec
    assert request_slo_ms(100, 2000.0, None) == 2000.0
    assert request_slo_ms(100, None, 20.0, base_ms=500.0) == 2500.0 and request_slo_ms(100, None, None) is None
    body = build_body(RequestSpec(prompt="hi", prompt_len=1, output_len=100), "completions", None, False, {},
                      slo_ms=2500.0)
    assert body["slo_ms"] == 2500.0
    r = RequestResult(index=0, prompt_len=1, expected_output_len=100, slo_ms=2500.0)
    handle_event(r, "", '{"choices": [{"text": "x", "finish_reason": "length", '
                        '"dllm": {"thresholds": [0.9, 0.7]}}]}', 0.1)
    r.ok, r.latency = True, 2.0
    late = RequestResult(index=1, prompt_len=1, expected_output_len=100, slo_ms=1000.0, ok=True, latency=2.0)
    failed = RequestResult(index=2, prompt_len=1, expected_output_len=100, slo_ms=5000.0)
    assert r.thresholds == [0.9, 0.7] and meets_slo(r, {}) and not meets_slo(late, {})
    s = slo_summary([r, late, failed], duration=4.0)
    assert (s["met"], s["requests"], s["goodput_req_s"]) == (1, 3, 0.25)
    assert abs(s["attainment"] - 1 / 3) < 1e-9 and s["mean_threshold"] == 0.8
