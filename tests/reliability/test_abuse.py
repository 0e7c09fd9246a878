"""Abuse: bodies too large, prompts too long, JSON nested too deep or not UTF-8, limits on counts,
and 10k connections opened and dropped. Each is answered with a 4xx (never a 5xx) while a probe
measures what the other clients see. The server runs with its default limits (4 MiB bodies)."""
from __future__ import annotations

import os
import resource
import socket
import struct
import time

import httpx
import pytest

from .conftest import start
from .tools import Probe, dumps, five_xx, ms, rss_mb, unloaded


@pytest.fixture(scope="module")
def server(tiny_llada, tmp_path_factory):
    s = start(tiny_llada, "--block-length", "8", tmp_path=tmp_path_factory.mktemp("abuse"))
    yield s
    s.stop()


def _post(url: str, content, path: str = "/v1/completions", timeout: float = 120) -> tuple[httpx.Response, float]:
    t = time.monotonic()
    r = httpx.post(url + path, content=content, headers={"Content-Type": "application/json"}, timeout=timeout,
                   trust_env=False)
    return r, time.monotonic() - t


def _while_probed(server, send) -> tuple[object, float, float, list[float]]:
    """Run `send()` while a probe keeps sending short requests; returns (send's result, its
    seconds, the probe's unloaded median, the latencies of the probe requests that overlapped)."""
    base = unloaded(server.url)
    with Probe(server.url) as probe:
        time.sleep(0.5)
        t0 = time.monotonic()
        result = send()
        t1 = time.monotonic()
        time.sleep(0.5)
    assert set(probe.statuses()) == {200}, probe.statuses()
    return result, t1 - t0, base, probe.latencies(t0, t1)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_20_mb_prompt_is_refused_within_a_second_and_others_do_not_wait(server, figures, framing):
    """Issue 17's first hole: it was read, parsed and tokenized on the event loop (37 s)."""
    big = b'{"prompt": "' + b"All the world's a stage. " * (20 * 2 ** 20 // 25) + b'", "max_tokens": 8}'
    content = big if framing == "content-length" else (big[i:i + 2 ** 16] for i in range(0, len(big), 2 ** 16))
    (r, _), took, base, during = _while_probed(server, lambda: _post(server.url, content))
    figures(f"20 MB prompt ({framing})", status=r.status_code, seconds=round(took, 3),
            probe_unloaded_ms=round(1e3 * base, 1), probe_during=ms(during))
    assert r.status_code in (400, 413) and r.json()["error"]["code"] == r.status_code, r.text[:300]
    assert took < 1.0
    assert not during or max(during) <= 2 * base + 0.01, (during, base)


def test_deeply_nested_json_is_a_400(server, figures):
    """Issue 17's second hole: 100,000 nested arrays as the prompt were a 500."""
    nested = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r, took = _post(server.url, nested)
    figures("nested JSON (100k arrays)", status=r.status_code, seconds=round(took, 3))
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError", r.text[:300]
    for body in (b"[" * 100_000, b'{"messages": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001):
        assert _post(server.url, body, "/v1/chat/completions")[0].status_code == 400


def test_a_prompt_under_the_body_cap_but_past_any_context_is_refused_before_tokenizing(server, figures):
    body = dumps({"prompt": "x" * (3 * 2 ** 20), "max_tokens": 8})
    (r, _), took, base, during = _while_probed(server, lambda: _post(server.url, body))
    figures("3 MB prompt (cheap length bound)", status=r.status_code, seconds=round(took, 3),
            probe_unloaded_ms=round(1e3 * base, 1), probe_during=ms(during))
    assert r.status_code == 400 and "characters cannot fit" in r.json()["error"]["message"]
    assert took < 1.0
    assert not during or max(during) <= 2 * base + 0.01, (during, base)


def test_long_prompts_are_tokenized_off_the_event_loop(server, figures):
    """Past the cheap bound's reach (it cannot prove they are too long) but longer than the
    context: tokenized on the tokenize thread, then refused; the probe keeps its pace."""
    chat = dumps({"messages": [{"role": "user", "content": "y" * 60_000}] * 1, "max_tokens": 8})
    prompts = dumps({"prompt": ["z" * 60_000] * 20, "max_tokens": 8})

    def send():
        return [_post(server.url, chat, "/v1/chat/completions")[0], _post(server.url, prompts)[0]]
    rs, took, base, during = _while_probed(server, send)
    figures("60k-character prompts (tokenized off the loop)", statuses=[r.status_code for r in rs],
            seconds=round(took, 3), probe_unloaded_ms=round(1e3 * base, 1), probe_during=ms(during))
    assert [r.status_code for r in rs] == [400, 400]
    assert all("exceeds the model context" in r.json()["error"]["message"] for r in rs)
    assert not during or sorted(during)[len(during) // 2] <= 2 * base + 0.01, (during, base)


@pytest.mark.parametrize("body", [b'{"prompt": "\xff\xfe\xfd"}', b'{"prompt": "ok", "user": "\xc3\x28"}',
                                  b'{"prompt": "\\ud800"}', b'\xef\xbb\xbf{"prompt": "x"}', b"", b"null"])
def test_invalid_utf8_and_other_undecodable_bodies_are_400(server, body):
    r, _ = _post(server.url, body)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["code"] == 400


@pytest.mark.parametrize("field,body", [
    ("messages", {"messages": [{"role": "user", "content": "a"}] * 513}),
    ("stop", {"messages": [{"role": "user", "content": "a"}], "stop": ["s"] * 17}),
    ("stop", {"messages": [{"role": "user", "content": "a"}], "stop": "s" * 257}),
])
def test_count_and_length_caps_are_400_naming_the_field(server, field, body):
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30, trust_env=False)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text[:300]


def test_too_many_prompts_in_one_request_is_400(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": ["a"] * 257}, timeout=30, trust_env=False)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_10k_connections_opened_and_dropped(server, figures):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 11_000:
        pytest.skip(f"needs 11000 open files here, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = server.url.removeprefix("http://").split(":")
    fds_before = _open_fds(server.pid)
    rss_before = rss_mb(server.pid)

    def storm():
        socks = []
        for i in range(10_000):
            s = socket.socket()
            s.connect((host, int(port)))
            if i % 3 == 0:
                s.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
            elif i % 3 == 1:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))    # RST on close
            socks.append(s)
        peak = _open_fds(server.pid)
        for s in socks:
            s.close()
        return peak
    try:
        peak_fds, took, base, during = _while_probed(server, storm)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    released = _wait_fds(server.pid, fds_before + 20)
    errors_5xx = five_xx(server.url)
    figures("10k connections opened and dropped", seconds=round(took, 2), server_fds=[fds_before, peak_fds, released],
            front_rss_mb=[rss_before, rss_mb(server.pid)], probe_unloaded_ms=round(1e3 * base, 1),
            probe_during=ms(during), error_responses_5xx=errors_5xx)
    assert released <= fds_before + 20
    assert errors_5xx == 0
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    assert not during or sorted(during)[len(during) // 2] <= 10 * base, (ms(during), base)


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _wait_fds(pid: int, target: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    n = _open_fds(pid)
    while n > target and time.monotonic() < deadline:
        time.sleep(0.2)
        n = _open_fds(pid)
    return n
