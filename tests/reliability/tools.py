"""What the reliability suite measures with: processes and their memory from /proc, the server's
metrics, a latency probe that keeps sending short requests in a thread, raw sockets for clients
that misbehave, and the machine's condition to print next to every figure."""
from __future__ import annotations

import json
import multiprocessing
import os
import socket
import statistics
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

PROBE = {"prompt": "Good morrow", "max_tokens": 8, "block_length": 8}


def machine() -> str:
    """The condition a figure was measured in: cores and the load average at that moment."""
    load1, load5, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {load1:.2f} (1 min) / {load5:.2f} (5 min)"


def children(pid: int) -> set[int]:
    """Direct children of `pid` (field 4 of /proc/N/stat is the parent)."""
    kids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.add(int(entry))
    return kids


def worker_pids(server_pid: int) -> list[int]:
    """The server's worker processes (not the multiprocessing resource tracker), in spawn order:
    pids grow, so index i is worker i."""
    pids = []
    for pid in children(server_pid):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "spawn_main" in cmd:
            pids.append(pid)
    return sorted(pids)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid` (field 6 of /proc/N/stat): what a server started in its own session left."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(entry))
    return out


def rss_mb(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics, summed over labels (counters by their _total name)."""
    out: dict[str, float] = {}
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def five_xx(url: str) -> int:
    """Error responses with a 5xx code the server sent (dllm:error_responses by code)."""
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    return int(sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "dllm:error_responses_total" and s.labels.get("code", "").startswith("5")))


def wait_for(cond, timeout: float = 30.0, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return False


def quiet(url: str, timeout: float = 30.0) -> bool:
    """Nothing running or waiting, every KV page back in the pool, no block leased."""
    def idle():
        m = metrics(url)
        return (m.get("dllm:num_requests_running") == 0 and m.get("dllm:num_requests_waiting") == 0
                and m.get("dllm:kv_cache_usage_perc") == 0 and m.get("dllm:block_leases") == 0)
    return wait_for(idle, timeout, 0.2)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank), or nan for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))]


def ms(values: list[float]) -> dict:
    """p50 / p99 / max in milliseconds, and the count."""
    return {"n": len(values), "p50_ms": round(1e3 * pct(values, 0.5), 1), "p99_ms": round(1e3 * pct(values, 0.99), 1),
            "max_ms": round(1e3 * max(values), 1) if values else None}


def _probe_main(url: str, body: dict, stream: bool, stop, started, conn) -> None:
    """The probe's process: short requests one after another until `stop`; the samples go back
    through `conn` at the end."""
    samples: list[tuple[float, float, int]] = []
    with httpx.Client(timeout=60, trust_env=False) as client:
        while not stop.is_set():
            t = time.monotonic()
            try:
                if stream:
                    with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
                        for _ in r.iter_lines():
                            pass
                        status = r.status_code
                else:
                    status = client.post(url + "/v1/completions", json=body).status_code
            except httpx.HTTPError:
                status = 0
            samples.append((t, time.monotonic() - t, status))
            started.set()
    conn.send(samples)


class Probe:
    """Short requests, one after another, from a process of its own (so that nothing the test
    does holds its interpreter): (sent_at, latency, status) of each, on the system-wide monotonic
    clock. What 'the other clients' see while something else happens to the server."""

    def __init__(self, url: str, body: dict | None = None, stream: bool = False):
        ctx = multiprocessing.get_context("spawn")
        self.samples: list[tuple[float, float, int]] = []
        self._stop, self._started = ctx.Event(), ctx.Event()
        self._conn, child = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_probe_main, args=(url, body or PROBE, stream, self._stop, self._started,
                                                           child), daemon=True)

    def __enter__(self) -> "Probe":
        self._proc.start()
        assert self._started.wait(60), "the probe never got a reply"
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._conn.poll(90):
            self.samples = self._conn.recv()
        self._proc.join(10)

    def latencies(self, start: float = 0.0, end: float = float("inf")) -> list[float]:
        """Requests whose time in flight overlapped [start, end] (monotonic clock)."""
        return [lat for t, lat, _ in self.samples if t <= end and t + lat >= start]

    def within(self, start: float, end: float) -> list[float]:
        """Requests sent and answered within [start, end]."""
        return [lat for t, lat, _ in self.samples if t >= start and t + lat <= end]

    def statuses(self) -> list[int]:
        return [s for _, _, s in self.samples]


def unloaded(url: str, n: int = 10, body: dict | None = None) -> float:
    """Median latency of `n` short requests sent alone (after one to warm up)."""
    lats = []
    with httpx.Client(timeout=60, trust_env=False) as c:
        for i in range(n + 1):
            t = time.monotonic()
            assert c.post(url + "/v1/completions", json=body or PROBE).status_code == 200
            if i:
                lats.append(time.monotonic() - t)
    return statistics.median(lats)


def raw_request(url: str, path: str, body: bytes, rcvbuf: int | None = None,
                headers: str = "Content-Type: application/json\r\n") -> socket.socket:
    """Send one HTTP/1.1 POST on a raw socket and return it unread (a client that never reads;
    `rcvbuf` shrinks its receive buffer first, so the server's writes back up quickly)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((host, int(port)))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Length: {len(body)}\r\n\r\n".encode()
              + body)
    return s


def read_response(s: socket.socket, timeout: float = 30.0) -> tuple[int, bytes]:
    """Status and body of a (non-streaming) response on a raw socket."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head else 0
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length:")), None)
    while length is not None and len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, rest


def dumps(obj) -> bytes:
    return json.dumps(obj).encode()
