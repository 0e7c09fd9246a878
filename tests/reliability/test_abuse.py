"""Abuse: bodies too large, prompts too long, JSON nested too deep or not UTF-8, limits on counts,
and 10k connections opened and dropped. Each is answered with a 4xx (never a 5xx) while a probe
measures what the other clients see. The server runs with its default limits (4 MiB bodies)."""
from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import statistics
import struct
import threading
import time

import httpx
import pytest

from .conftest import start
from .tools import Probe, dumps, five_xx, ms, read_response, rss_mb


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


# A quick abuse repeats for this long: a refusal in 50 ms overlapped two probes, too few for a median (one slow
# probe of 40 ms failed the 2x bound in CI)
SUSTAIN_S = 0.5


def _while_probed(server, send, sustain_s: float = 0.0) -> tuple[object, float, float, list[float]]:
    """Run `send()`, again and again for `sustain_s`, while a probe keeps sending short requests; returns (the first
    send's result, its seconds, the probe's median latency in the 1.5 s before (the unloaded value, measured in the
    machine's condition of the moment), the latencies of the probe requests that overlapped the abuse)."""
    with Probe(server.url) as probe:
        c0 = time.monotonic()
        time.sleep(1.5)
        t0 = time.monotonic()
        result = send()
        took = time.monotonic() - t0
        while time.monotonic() - t0 < sustain_s:
            send()
        t1 = time.monotonic()
        time.sleep(0.5)
    assert set(probe.statuses()) == {200}, probe.statuses()
    return result, took, statistics.median(probe.within(c0, t0)), probe.latencies(t0, t1)


def _within_2x(during: list[float], base: float) -> bool:
    """The other clients' median latency during the abuse within 2x its unloaded value, with 25 ms of slack: with
    an 11-ms probe one request that lost its core to the test's own client (34 ms, one of one) failed a 5-ms slack
    in CI, while a loop blocked by the abuse costs hundreds of ms (issue 17's took 37 s). The max is recorded, not
    asserted: on a shared 2-core machine one request in a few dozen can lose its core to anything."""
    return not during or statistics.median(during) <= 2 * base + 0.025


def _upload(url: str, body: bytes, chunked: bool) -> tuple[int, dict, float]:
    """POST `body` on a raw socket, sent from a thread while this one waits for the answer: the
    status, the error body and the seconds until the answer came (the server may answer before
    the upload is over; the test's own upload speed is not the server's)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    if chunked:
        chunks = (body[i:i + 2 ** 16] for i in range(0, len(body), 2 ** 16))
        body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
        body += b"0\r\n\r\n"

    def upload():
        with contextlib.suppress(OSError):
            s.sendall(head.encode() + body)
    t0 = time.monotonic()
    sender = threading.Thread(target=upload, daemon=True)
    sender.start()
    status, reply = read_response(s)
    took = time.monotonic() - t0
    s.close()
    sender.join(30)
    return status, json.loads(reply), took


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_20_mb_prompt_is_refused_within_a_second_and_others_do_not_wait(server, figures, framing):
    """Issue 17's first hole: it was read, parsed and tokenized on the event loop (37 s)."""
    big = b'{"prompt": "' + b"All the world's a stage. " * (20 * 2 ** 20 // 25) + b'", "max_tokens": 8}'
    (status, reply, answered), took, base, during = _while_probed(
        server, lambda: _upload(server.url, big, framing == "chunked"))
    figures(f"20 MB prompt ({framing})", status=status, answered_s=round(answered, 3), seconds=round(took, 3),
            probe_unloaded_ms=round(1e3 * base, 1), probe_during=ms(during))
    assert status in (400, 413) and reply["error"]["code"] == status, reply
    assert answered < 1.0
    assert _within_2x(during, base), (ms(during), base)
    # An ordinary client (it sends everything, then reads) gets the same answer.
    r, _ = _post(server.url, big)
    assert r.status_code == 413


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
    (r, _), took, base, during = _while_probed(server, lambda: _post(server.url, body), SUSTAIN_S)
    figures("3 MB prompt (cheap length bound)", status=r.status_code, seconds=round(took, 3),
            probe_unloaded_ms=round(1e3 * base, 1), probe_during=ms(during))
    assert r.status_code == 400 and "characters cannot fit" in r.json()["error"]["message"]
    assert took < 1.0
    assert _within_2x(during, base), (ms(during), base)


def test_long_prompts_are_tokenized_off_the_event_loop(server, figures):
    """Past the cheap bound's reach (it cannot prove they are too long) but longer than the
    context: tokenized on the tokenize thread, then refused; the probe keeps its pace."""
    chat = dumps({"messages": [{"role": "user", "content": "y" * 60_000}] * 1, "max_tokens": 8})
    prompts = dumps({"prompt": ["z" * 60_000] * 20, "max_tokens": 8})

    def send():
        return [_post(server.url, chat, "/v1/chat/completions")[0], _post(server.url, prompts)[0]]
    rs, took, base, during = _while_probed(server, send, SUSTAIN_S)
    figures("60k-character prompts (tokenized off the loop)", statuses=[r.status_code for r in rs],
            seconds=round(took, 3), probe_unloaded_ms=round(1e3 * base, 1), probe_during=ms(during))
    assert [r.status_code for r in rs] == [400, 400]
    assert all("exceeds the model context" in r.json()["error"]["message"] for r in rs)
    assert _within_2x(during, base), (ms(during), base)


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


STORM_WAIT_S = 5.0      # the longest a connected client may wait during the 10k-connection storm


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
    # asyncio accepts up to the listen backlog (uvicorn's 2048) in one loop turn and runs their
    # connection_made before anything else, so a connected client's request can wait behind one such
    # burst: 1.0-1.8 s here, for a few of the 7-27 probes of a 2.5 s storm, whose median is therefore
    # 17-27 ms in most runs and 305 ms in one CI run. What is asserted is that nobody starves.
    # (A backlog of 128 cuts the wait to 0.5 s but makes the storm's own connects take 50 s.)
    assert not during or max(during) <= STORM_WAIT_S, (ms(during), base)


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _wait_fds(pid: int, target: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    n = _open_fds(pid)
    while n > target and time.monotonic() < deadline:
        time.sleep(0.2)
        n = _open_fds(pid)
    return n
