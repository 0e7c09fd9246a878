"""Disconnects free KV, a full queue answers 503, SIGTERM drains and reaps every child,
/metrics parses."""
import json
import os
import signal
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.reliability.tools import children, worker_pids

from .conftest import start_server


def metric(server, name, **labels):
    for fam in text_string_to_metric_families(httpx.get(server.url + "/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def wait_for(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


# One token per forward, one block: the KV pages stay allocated for the whole request.
SLOW = {"prompt": [1, 2, 3], "max_tokens": 256, "steps": 256, "block_length": 256, "ignore_eos": True}
SLOWER = {**SLOW, "max_tokens": 768, "steps": 768}       # three blocks of 256, one position per step


def test_disconnect_mid_stream_frees_kv(server):
    with httpx.stream("POST", server.url + "/v1/completions", json={**SLOW, "stream": True,
                      "stream_options": {"include_progress": True}}, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        assert metric(server, "dllm:kv_cache_usage_perc") > 0
    # The connection is closed: the request is aborted and its pages come back.
    assert wait_for(lambda: metric(server, "dllm:kv_cache_usage_perc") == 0.0
                    and metric(server, "dllm:num_requests_running") == 0)


def test_disconnect_of_a_non_streaming_request_frees_kv(server):
    with httpx.Client(timeout=0.5) as c:
        try:
            c.post(server.url + "/v1/completions", json=SLOW)
        except httpx.TimeoutException:
            pass
    assert wait_for(lambda: metric(server, "dllm:kv_cache_usage_perc") == 0.0
                    and metric(server, "dllm:num_requests_running") == 0)


def test_metrics_parse_and_count(server):
    httpx.post(server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 8}, timeout=60)
    text = httpx.get(server.url + "/metrics", timeout=10).text
    names = {f.name for f in text_string_to_metric_families(text)}
    for want in ("dllm:num_requests_running", "dllm:num_requests_waiting", "dllm:kv_cache_usage_perc",
                 "dllm:time_to_first_token_seconds", "dllm:e2e_request_latency_seconds",
                 "dllm:request_queue_time_seconds", "dllm:prompt_tokens", "dllm:generation_tokens",
                 "dllm:denoising_steps", "dllm:committed_tokens", "dllm:canvas_positions",
                 "dllm:tokens_per_forward", "dllm:worker_deficit_tokens", "dllm:kv_transfer_bytes",
                 "dllm:kv_handoffs", "dllm:kv_handoff_stall_seconds",
                 "vllm:diffusion_num_denoising_steps", "vllm:diffusion_num_committed_tokens",
                 "vllm:diffusion_num_canvas_positions"):
        assert want in names, want
    assert metric(server, "dllm:generation_tokens_total") >= 1
    assert metric(server, "dllm:canvas_positions_total") > 0


def test_version_and_metrics_report_each_workers_batch_invariance_check(server):
    """The start-up self-check (worker/determinism.py) reaches /version and /metrics, whatever
    its verdict on this CPU; the demo of a verdict of each kind is tests/worker/test_determinism.py."""
    v = httpx.get(server.url + "/version", timeout=10).json()
    check = v["batch_invariance"]["0"]
    assert isinstance(check["holds"], bool) and check["fixed_matmul_rows"] == 0
    assert check["row_counts_checked"] > 10 and check["max_rows_checked"] >= 8 and check["projection_shapes"]
    assert check["holds"] == (check["num_failures"] == 0)
    assert metric(server, "dllm:batch_invariant", worker="0") == (1.0 if check["holds"] else 0.0)


def test_full_queue_answers_503_with_retry_after(tiny_llada, tmp_path):
    s = start_server(tiny_llada, "--block-length", "8", "--max-active-decodes", "1", "--max-waiting-requests", "1",
                     tmp_path=tmp_path)
    try:
        results = {}

        def post(name):     # long enough that `a` still runs when the third request comes (~2 s)
            results[name] = httpx.post(s.url + "/v1/completions", json=SLOWER, timeout=120)
        a = threading.Thread(target=post, args=("a",))
        a.start()
        assert wait_for(lambda: metric(s, "dllm:num_requests_running") == 1)
        b = threading.Thread(target=post, args=("b",))
        b.start()
        assert wait_for(lambda: metric(s, "dllm:num_requests_waiting") == 1)
        r = httpx.post(s.url + "/v1/completions", json=SLOW, timeout=30)
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
        a.join(120)
        b.join(120)
        assert results["a"].status_code == 200 and results["b"].status_code == 200
    finally:
        s.stop()


def _stream_in_thread(url, body, out):
    def run():
        chunks = []
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
                elif line == "data: [DONE]":
                    chunks.append("[DONE]")
        out.append(chunks)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_sigterm_drains_in_flight_requests_and_reaps_children(tiny_llada, tmp_path):
    s = start_server(tiny_llada, "--block-length", "8", "--num-workers", "2", "--shutdown-timeout-s", "60",
                     tmp_path=tmp_path)
    kids = children(s.proc.pid)
    assert len(kids) >= 2
    out = []
    body = {"prompt": [4, 5], "max_tokens": 960, "steps": 960, "ignore_eos": True}   # long enough to catch in flight
    threads = [_stream_in_thread(s.url + "/v1/completions", body, out) for _ in range(3)]
    assert wait_for(lambda: (metric(s, "dllm:num_requests_running") or 0) == 3)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert httpx.get(s.url + "/health", timeout=10).status_code == 503
    assert httpx.post(s.url + "/v1/completions", json=body, timeout=10).status_code == 503
    assert s.proc.wait(90) == 0
    for t in threads:
        t.join(30)
    assert len(out) == 3
    for chunks in out:
        assert chunks[-1] == "[DONE]"
        assert [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]] == ["length"]
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{k}") for k in kids), 10)


def test_sigterm_with_zero_timeout_aborts_in_flight(tiny_llada, tmp_path):
    s = start_server(tiny_llada, "--block-length", "8", "--shutdown-timeout-s", "0", tmp_path=tmp_path)
    kids = children(s.proc.pid)
    out = []
    t = _stream_in_thread(s.url + "/v1/completions", SLOW, out)
    assert wait_for(lambda: metric(s, "dllm:num_requests_running") == 1)
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0
    t.join(30)
    finishes = [c["choices"][0]["finish_reason"] for c in out[0][:-1] if c["choices"][0]["finish_reason"]]
    assert finishes == ["abort"] and out[0][-1] == "[DONE]"
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{k}") for k in kids), 10)


def _health(s, timeout: float) -> int | None:
    """/health's status, None past `timeout`: a probe request in flight when the worker dies is resumed and answers
    200 once the restarted worker serves, so one long poll can span the whole 503 window."""
    try:
        return httpx.get(s.url + "/health", timeout=timeout).status_code
    except httpx.TimeoutException:
        return None


def test_health_is_503_while_a_killed_worker_restarts(tiny_llada, tmp_path):
    s = start_server(tiny_llada, "--block-length", "8", tmp_path=tmp_path)
    try:
        [worker] = worker_pids(s.proc.pid)
        os.kill(worker, signal.SIGKILL)
        assert wait_for(lambda: _health(s, 0.5) == 503, 10)
        assert wait_for(lambda: httpx.get(s.url + "/health", timeout=30).status_code == 200, 60)
        assert worker_pids(s.proc.pid) != [worker]
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "a", "max_tokens": 8}, timeout=60)
        assert r.status_code == 200
    finally:
        s.stop()


def test_without_restart_a_dead_worker_stops_the_server_non_zero(tiny_llada, tmp_path):
    s = start_server(tiny_llada, "--block-length", "8", "--no-restart-workers", tmp_path=tmp_path)
    [worker] = worker_pids(s.proc.pid)
    kids = children(s.proc.pid)
    os.kill(worker, signal.SIGKILL)
    assert s.proc.wait(30) == 1
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{k}") for k in kids), 10)


def test_keep_alive_comments_while_a_stream_waits(tiny_llada, tmp_path):
    s = start_server(tiny_llada, "--block-length", "8", "--max-active-decodes", "1", "--keep-alive-s", "0.2",
                     tmp_path=tmp_path)
    try:
        blocker = threading.Thread(target=lambda: httpx.post(s.url + "/v1/completions", json=SLOW, timeout=120))
        blocker.start()
        assert wait_for(lambda: metric(s, "dllm:num_requests_running") == 1)
        lines = []
        with httpx.stream("POST", s.url + "/v1/completions", json={**SLOW, "max_tokens": 8, "block_length": 8,
                                                                    "steps": 8, "stream": True}, timeout=120) as r:
            for line in r.iter_lines():
                lines.append(line)
        blocker.join(120)
        assert ": keep-alive" in lines                       # sent while queued behind the blocker
        assert lines.index(": keep-alive") < next(i for i, l in enumerate(lines) if l.startswith("data: {"))
        assert lines[-1] == "data: [DONE]" or lines[-2] == "data: [DONE]"
    finally:
        s.stop()
