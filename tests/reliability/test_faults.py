"""Faults: a worker that hangs in a forward (the watchdog), a decode worker killed mid-KV-handoff,
SIGTERM under load, SIGKILL of the front process. No client hangs; what was in flight ends with
a clear error (or, for SIGTERM, finishes); the server serves again or exits cleanly; no process
is left behind."""
from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from dllm_server.server_process import wait_healthy

from .conftest import start
from .tools import alive, metrics, wait_for, worker_pids


def _streams(url: str, body: dict, n: int) -> tuple[list[threading.Thread], list[dict]]:
    """n streamed completions in threads; each result: status, finish reasons, errors, [DONE]."""
    results: list[dict] = []

    def run():
        res = {"status": 0, "finish": [], "errors": [], "done": False, "ended_at": None}
        try:
            # verify=False: plain HTTP anyway, and building a client's TLS context costs ~25 ms of
            # CPU; n threads doing it at once on a loaded machine spread the arrivals over seconds.
            with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120,
                              trust_env=False, verify=False) as r:
                res["status"] = r.status_code
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        res["done"] = True
                    elif line.startswith("data: ") and '"error"' in line and '"choices"' not in line:
                        res["errors"].append(line[6:200])
                    elif '"finish_reason":"' in line:
                        res["finish"].append(line.split('"finish_reason":"')[1].split('"')[0])
        except httpx.HTTPError as exc:
            res["errors"].append(f"{type(exc).__name__}: {exc}")
        res["ended_at"] = time.monotonic()
        results.append(res)
    threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, results


@pytest.fixture(scope="module", autouse=True)
def two_workers(tiny_llada, tmp_path_factory):
    """The SIGTERM test's server (two workers), started with the module so that it boots while
    the tests before it run; the test waits for it to be healthy."""
    s = start(tiny_llada, "--block-length", "8", "--num-workers", "2", "--shutdown-timeout-s", "60",
              tmp_path=tmp_path_factory.mktemp("sigterm"), wait=False)
    yield s
    s.stop(timeout=5)


def test_a_hung_worker_is_killed_by_the_watchdog(tiny_llada, tmp_path, figures):
    s = start(tiny_llada, "--block-length", "8", "--worker-stall-timeout-s", "2", tmp_path=tmp_path,
              env={"DLLM_TEST_HOOKS": "hang_at_forward=40"})
    try:
        [victim] = worker_pids(s.pid)
        body = {"prompt": [4, 5, 6], "max_tokens": 64, "steps": 64, "ignore_eos": True}
        t0 = time.monotonic()
        threads, results = _streams(s.url, body, 3)
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        failed_after = time.monotonic() - t0
        for t in threads:
            t.join(60)
        # the hung worker's requests resume on its restarted successor: answered, none failed
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length", r.text
        assert all(res["status"] == 200 and res["done"] and res["finish"] == ["length"] and not res["errors"]
                   for res in results), results
        assert wait_for(lambda: httpx.get(s.url + "/health", timeout=30).status_code == 200, 60)
        healthy_after = time.monotonic() - t0
        ok = httpx.post(s.url + "/v1/completions", json={"prompt": "a", "max_tokens": 8}, timeout=60)
        m = metrics(s.url)
        figures("worker hang (watchdog 2 s)", requests_answered_after_s=round(failed_after, 2),
                healthy_again_after_s=round(healthy_after, 2), worker_hangs=m["dllm:worker_hangs_total"],
                worker_restarts=m["dllm:worker_restarts_total"], requests_resumed=m["dllm:requests_resumed_total"])
        assert ok.status_code == 200 and m["dllm:worker_hangs_total"] == 1 and m["dllm:requests_resumed_total"] >= 4
        assert not alive(victim) and worker_pids(s.pid) != [victim]
    finally:
        s.stop()


@pytest.fixture(scope="module")
def disaggregated(tiny_llada, tmp_path_factory):
    """One prefill and one decode worker, with a KV-transfer process group: killed mid-handoff
    first, then (restarted) the server itself is SIGKILLed."""
    s = start(tiny_llada, "--block-length", "8", "--placement", "disaggregated", "--num-workers", "1",
              tmp_path=tmp_path_factory.mktemp("disagg"))
    yield s
    s.stop(timeout=5)


def test_a_decode_worker_killed_mid_handoff(disaggregated, figures):
    s = disaggregated
    prefill, decode = worker_pids(s.pid)        # worker 0 prefills, worker 1 decodes
    body = {"prompt": [7, 8, 9] * 40, "max_tokens": 96, "steps": 96, "ignore_eos": True}
    threads, results = _streams(s.url, body, 16)
    assert wait_for(lambda: metrics(s.url)["dllm:kv_handoffs_total"] > 2, 30)
    os.kill(decode, signal.SIGKILL)
    killed_at = time.monotonic()
    for t in threads:
        t.join(60)
    assert len(results) == 16 and all(res["done"] for res in results), results
    ends = [res["finish"][-1] if res["finish"] else "error" for res in results]
    assert set(ends) == {"length"} and not any(res["errors"] for res in results), results   # resumed, none lost
    last_end = max(res["ended_at"] for res in results) - killed_at
    assert wait_for(lambda: httpx.get(s.url + "/health", timeout=30).status_code == 200, 60)
    healthy = time.monotonic() - killed_at
    again = httpx.post(s.url + "/v1/completions", json={**body, "max_tokens": 16, "steps": 16}, timeout=60)
    figures("decode worker killed mid-handoff", in_flight=16, ended={e: ends.count(e) for e in set(ends)},
            all_ended_within_s=round(last_end, 2), healthy_again_after_s=round(healthy, 2))
    assert again.status_code == 200 and metrics(s.url)["dllm:requests_resumed_total"] >= 1
    assert not alive(prefill) and not alive(decode)        # a process group restarts together


def test_sigterm_under_load_drains(two_workers, figures):
    s = two_workers
    wait_healthy(s)
    workers = worker_pids(s.pid)
    # Long enough to be in flight when the signal comes (a 256-token request takes 0.5 s here).
    body = {"prompt": [4, 5], "max_tokens": 768, "steps": 768, "ignore_eos": True}
    threads, results = _streams(s.url, body, 16)
    assert wait_for(lambda: metrics(s.url)["dllm:num_requests_running"] >= 8, 30)
    in_flight = metrics(s.url)["dllm:num_requests_running"] + metrics(s.url)["dllm:num_requests_waiting"]
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    refused = httpx.post(s.url + "/v1/completions", json=body, timeout=10)
    code = s.proc.wait(90)
    drained = time.monotonic() - t0
    for t in threads:
        t.join(30)
    gone = wait_for(lambda: not any(alive(p) for p in workers), 10)
    ends = [res["finish"][-1] if res["finish"] else "none" for res in results]
    figures("SIGTERM under load", in_flight=in_flight, drained_s=round(drained, 2), exit_code=code,
            new_request_status=refused.status_code, ended={e: ends.count(e) for e in set(ends)})
    assert code == 0 and refused.status_code == 503 and gone
    assert len(results) == 16 and all(res["done"] and not res["errors"] for res in results), results
    assert set(ends) == {"length"}


def test_sigkill_of_the_front_leaves_no_worker(disaggregated, figures):
    """The workers are busy (a parent-death signal, not the idle loop's check, must end them):
    the disaggregated server's prefill and decode workers, restarted by the test above."""
    s = disaggregated
    assert wait_for(lambda: httpx.get(s.url + "/health", timeout=30).status_code == 200, 60)
    workers = worker_pids(s.pid)
    assert len(workers) == 2
    body = {"prompt": [4, 5], "max_tokens": 960, "steps": 960, "ignore_eos": True}
    handoffs = metrics(s.url)["dllm:kv_handoffs_total"]
    threads, _ = _streams(s.url, body, 16)
    # Both busy: blocks handed over (the decode worker decodes them) and more arriving to prefill.
    assert wait_for(lambda: metrics(s.url)["dllm:num_requests_running"] >= 4
                    and metrics(s.url)["dllm:kv_handoffs_total"] >= handoffs + 4, 60)
    os.kill(s.pid, signal.SIGKILL)
    t0 = time.monotonic()
    gone = wait_for(lambda: not any(alive(p) for p in workers), 5, every=0.02)
    took = time.monotonic() - t0
    figures("SIGKILL of the front", busy_workers=len(workers), all_gone=gone, gone_after_s=round(took, 3))
    s.stop(timeout=5)
    for t in threads:
        t.join(30)
    assert gone, [p for p in workers if alive(p)]
