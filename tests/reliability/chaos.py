"""The chaos run: a server (two TP=2 instances of a tiny block-causal checkpoint, the SLO policy, the prefix cache, a
bounded queue) under a steady load while faults are injected on a seeded schedule: SIGKILL of an instance's leader
and of a follower rank, SIGSTOP of a follower (a hang, SIGCONT later), SIGTERM of the front in the middle of a regroup
(asked for on POST /reconfigure; the server drains and exits, and is started again as a supervisor would), a client
that disconnects mid-stream, a burst past the queue limit. Then its Ray part (chaos_ray.py): the loss of a Ray node.
Every request must end exactly once, with an answer or a clear error; answers whose rule the request fixed must equal
the fault-free ones; no KV page, process or Ray actor may stay. Per fault kind it prints injected, requests affected,
time to detect, time to recover, what was not recovered or leaked.

    python -m tests.reliability.chaos [--duration 600] [--ray-duration 180] [--seed 0] [--json out.json]

tests/reliability/test_chaos.py runs its short form (each process kind once; the node loss is
tests/executor/test_ray.py's).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from dllm_server.server_process import serve

from .tools import alive, metrics, quiet, session_members, wait_for

KINDS = ("kill_worker", "kill_tp_rank", "stop_tp_rank", "sigterm_in_regroup", "client_disconnect", "burst")
SHARED = list(range(40, 80))            # a shared prompt prefix: the prefix cache holds its blocks
QUEUE = 8
STALL_S = 3
DRAIN_S = 60                            # --shutdown-timeout-s: every request in flight at a SIGTERM has time to end


@dataclass
class Request:
    prompt: list[int]
    fixed: bool                   # names its threshold: its answer must equal the fault-free one
    stream: bool
    endings: int = 0              # answers, [DONE]s and error frames seen: exactly 1 is right
    status: int = 0
    text: str = ""
    error: str | None = None
    finish: str | None = None     # the first choice's finish_reason ("abort": cut short by a shutdown)
    lost: bool = False            # no ending at all (connection dropped, timeout)


@dataclass
class Fault:
    kind: str
    at: float
    affected: int = 0
    detect_s: float | None = None
    recover_s: float | None = None
    leaked_processes: int | None = None     # processes of a stopped server's session left after it exited
    failed_checks: list[str] = field(default_factory=list)     # what this kind must also show, where it did not
    note: str = ""


@dataclass
class Run:
    requests: list[Request] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    leaked_pages: float = 0.0
    leaked_leases: float = 0.0
    wrong_answers: int = 0
    started: float = field(default_factory=time.monotonic)


class Front:
    """The server under test, started again after a SIGTERM as a supervisor would; the load pauses while it is down
    (a load balancer takes a stopping server out of rotation)."""

    def __init__(self, model: str, log_dir: Path, flags: tuple[str, ...] = ("--tensor-parallel-size", "2"),
                 name: str = "chaos-server", env: dict | None = None):
        self.model, self.log_dir, self.flags, self.name, self.env, self.starts = model, log_dir, flags, name, env, 0
        self.up = threading.Event()
        self.start()

    def start(self) -> None:
        self.starts += 1
        self.server = serve(self.model, "--threads-per-worker", "1", "--dtype", "float64", "--num-workers", "2",
                            "--threshold-policy", "slo", "--enable-prefix-caching",
                            "--max-waiting-requests", str(QUEUE), "--worker-stall-timeout-s", str(STALL_S),
                            "--admin-endpoints", "--shutdown-timeout-s", str(DRAIN_S), *self.flags,
                            log_path=self.log_dir / f"{self.name}-{self.starts}.log", env=self.env, timeout_s=180)
        self.up.set()

    @property
    def url(self) -> str:
        return self.server.url


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [SHARED + [rng.randrange(3, 250) for _ in range(rng.randrange(2, 12))] for _ in range(n)]


def body(r: Request) -> dict:
    b = {"prompt": r.prompt, "max_tokens": 48, "ignore_eos": True, "stream": r.stream}
    return {**b, "threshold": 0.9} if r.fixed else {**b, "slo_ms": 4000}


def send(url: str, r: Request, timeout: float = 120, barrier: threading.Barrier | None = None) -> None:
    # verify=False: plain HTTP anyway, and each client's TLS context costs ~25 ms of CPU (a burst would spread)
    if barrier is not None:
        barrier.wait()
    try:
        if not r.stream:
            resp = httpx.post(url + "/v1/completions", json=body(r), timeout=timeout, trust_env=False, verify=False)
            r.status, r.endings = resp.status_code, 1
            if resp.status_code == 200:
                r.text, r.finish = resp.json()["choices"][0]["text"], resp.json()["choices"][0]["finish_reason"]
            else:
                r.error = resp.json()["error"]["message"]
            return
        with httpx.stream("POST", url + "/v1/completions", json=body(r), timeout=timeout, trust_env=False,
                          verify=False) as resp:
            r.status = resp.status_code
            if resp.status_code != 200:
                resp.read()
                r.endings, r.error = 1, resp.json()["error"]["message"]
                return
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    r.endings += 1
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    r.error = chunk["error"]["message"]
                for c in chunk.get("choices", []):
                    r.text += c.get("text") or ""
                    r.finish = c.get("finish_reason") or r.finish
    except httpx.HTTPError as exc:
        r.lost, r.error = True, f"{type(exc).__name__}: {exc}"


def instances(url: str) -> list[dict]:
    return httpx.get(url + "/version", timeout=30, trust_env=False).json().get("instances", [])


def busiest(url: str) -> dict:
    """The instance that fed the most tokens in its last iteration (the prefix cache draws shared prompts to one:
    an idle instance's hung follower blocks nothing until work reaches it)."""
    fed: dict[str, float] = {}
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == "dllm:worker_iteration_tokens":
                fed[sample.labels["worker"]] = sample.value
    inst = instances(url)
    return max(inst, key=lambda i: fed.get(str(i["worker"]), 0.0))


def healthy(url: str, expected: int) -> bool:
    """Every instance up with live ranks, and a short request answered."""
    try:
        inst = instances(url)
        if len(inst) != expected or not all(p and alive(p) for i in inst for p in i["rank_pids"]):
            return False
        if metrics(url).get("dllm:worker_up", 0) != expected:
            return False
        r = httpx.post(url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 4}, timeout=30,
                       trust_env=False)
        return r.status_code == 200
    except (httpx.HTTPError, ValueError):
        return False


def sigterm_in_regroup(front: Front, fault: Fault, run: Run) -> None:
    """Ask for 2 x TP2 -> TP2 + 2 x TP1, SIGTERM the front once the regroup shows, let it drain and exit, start it
    again. Detect: SIGTERM to exit; recover: SIGTERM to serving again."""
    url, asked = front.url, {}

    def ask() -> None:
        try:
            resp = httpx.post(url + "/reconfigure", json={"tensor_parallel_sizes": [2, 1, 1]}, timeout=DRAIN_S + 60,
                              trust_env=False)
            asked["status"], asked["body"] = resp.status_code, resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            asked["status"] = f"{type(exc).__name__}: {exc}"
    caller = threading.Thread(target=ask)
    caller.start()
    def regrouping() -> bool:
        try:
            return httpx.get(url + "/reconfigure", timeout=10, trust_env=False).json()["regroup"] is not None
        except (httpx.HTTPError, ValueError):
            return False
    if not wait_for(regrouping, 30, 0.01):
        fault.failed_checks.append("the regroup never showed on GET /reconfigure")
    front.up.clear()
    time.sleep(0.2)                              # a request the load was sending as it paused reaches the server
    fault.at = time.monotonic()
    fault.affected = sum(1 for r in run.requests if r.endings == 0 and not r.lost)
    session = os.getsid(front.server.pid)
    front.server.proc.send_signal(signal.SIGTERM)
    try:
        code = front.server.proc.wait(DRAIN_S + 30)
        fault.detect_s = time.monotonic() - fault.at
        if code != 0:
            fault.failed_checks.append(f"the front exited with {code}")
    except subprocess.TimeoutExpired:
        fault.failed_checks.append(f"the front did not exit within {DRAIN_S + 30} s of SIGTERM")
    caller.join(30)
    if asked.get("status") not in (200, 503):
        fault.failed_checks.append(f"POST /reconfigure ended with {asked.get('status')!r}")
    fault.note = f"the regroup's call: {asked.get('status')} {json.dumps(asked.get('body'))[:160]}"
    wait_for(lambda: not session_members(session), 10, 0.1)
    fault.leaked_processes = len(session_members(session))
    front.server.stop(signal.SIGKILL, timeout=5)
    front.start()


def inject(front: Front, kind: str, rng: random.Random, run: Run, expected: int) -> Fault:
    url = front.url
    fault = Fault(kind, time.monotonic())
    before = metrics(url)
    if kind in ("kill_worker", "kill_tp_rank", "stop_tp_rank"):
        pid = busiest(url)["rank_pids"][0 if kind == "kill_worker" else 1]
        os.kill(pid, signal.SIGSTOP if kind == "stop_tp_rank" else signal.SIGKILL)
        counter = "dllm:worker_hangs_total" if kind == "stop_tp_rank" else "dllm:worker_restarts_total"
        if wait_for(lambda: metrics(url).get(counter, 0) > before.get(counter, 0), 60, 0.1):
            fault.detect_s = time.monotonic() - fault.at
        if kind == "stop_tp_rank" and alive(pid):
            os.kill(pid, signal.SIGCONT)               # the watchdog took the instance down; let the rank go
    elif kind == "sigterm_in_regroup":
        sigterm_in_regroup(front, fault, run)
        url = front.url
    elif kind == "client_disconnect":
        with httpx.stream("POST", url + "/v1/completions", json={"prompt": SHARED, "max_tokens": 64, "stream": True,
                                                                 "steps": 64, "ignore_eos": True},
                          timeout=60, trust_env=False) as resp:
            next(resp.iter_lines())                    # the first chunk, then hang up
        fault.detect_s = 0.0
        fault.affected = 1
    elif kind == "burst":
        burst = [Request(p, False, False) for p in prompts(4 * QUEUE + 16, rng.randrange(1 << 30))]
        barrier = threading.Barrier(len(burst))          # all at once
        threads = [threading.Thread(target=send, args=(url, r, 180, barrier)) for r in burst]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        run.requests += burst
        fault.affected = sum(r.status == 503 for r in burst)
        fault.detect_s = 0.0
    if wait_for(lambda: healthy(url, expected), 120, 0.5):
        fault.recover_s = time.monotonic() - fault.at
    after = metrics(url)
    if kind in ("kill_worker", "kill_tp_rank", "stop_tp_rank"):
        fault.affected = int(after.get("dllm:requests_resumed_total", 0) - before.get("dllm:requests_resumed_total", 0))
    return fault


def chaos(model: str, duration_s: float, seed: int, log_dir: Path, per_kind: int = 2,
          reference: dict[tuple[int, ...], str] | None = None) -> Run:
    """Runs the load and the schedule (every kind `per_kind` times, in a seeded order spread over `duration_s`)."""
    rng = random.Random(seed)
    schedule = [k for k in KINDS for _ in range(per_kind)]
    rng.shuffle(schedule)
    front = Front(model, log_dir)
    return under_load(front, seed, schedule, duration_s, reference,
                      lambda kind, run: inject(front, kind, rng, run, expected=2))


def under_load(front: Front, seed: int, schedule: list[str], duration_s: float,
               reference: dict[tuple[int, ...], str] | None, inject_one: Callable[[str, Run], Fault]) -> Run:
    """The steady load on `front` while `inject_one` runs the schedule spread over `duration_s`; then the checks
    that need the whole run (a KV page still held, fixed-rule answers against the reference). Stops the server."""
    run, stop = Run(), threading.Event()
    pool = prompts(8, seed)

    def load() -> None:                                # steady: one request every 0.25 s, each in its own thread
        i, threads = 0, []
        while not stop.is_set():
            front.up.wait()
            r = Request(pool[i % len(pool)], fixed=i % 2 == 0, stream=i % 3 != 0)
            run.requests.append(r)
            threads.append(threading.Thread(target=send, args=(front.url, r), daemon=True))
            threads[-1].start()
            i += 1
            stop.wait(0.25)
        for t in threads:
            t.join(180)
    try:
        loader = threading.Thread(target=load)
        loader.start()
        gap = duration_s / (len(schedule) + 1)
        t0 = time.monotonic()
        for n, kind in enumerate(schedule, 1):
            time.sleep(max(0.0, t0 + n * gap - time.monotonic()))
            run.faults.append(inject_one(kind, run))
        stop.set()
        loader.join()
        if not quiet(front.url, 60):
            m = metrics(front.url)
            run.leaked_pages = m.get("dllm:kv_cache_usage_perc", 0.0)
            run.leaked_leases = m.get("dllm:block_leases", 0.0)
        if reference is not None:
            run.wrong_answers = sum(1 for r in run.requests if r.fixed and r.status == 200 and not r.lost
                                    and r.text != reference[tuple(r.prompt)])
    finally:
        stop.set()
        front.up.set()
        front.server.stop()
    return run


def fault_free(model: str, log_dir: Path, seed: int) -> dict[tuple[int, ...], str]:
    """The fixed-rule answers of the load's prompts from the same layout, with no fault."""
    server = serve(model, "--threads-per-worker", "1", "--dtype", "float64", log_path=log_dir / "reference.log")
    try:
        out = {}
        for p in prompts(8, seed):
            r = Request(p, True, False)
            send(server.url, r)
            out[tuple(p)] = r.text
        return out
    finally:
        server.stop()


def summary(run: Run, kinds: tuple[str, ...] = KINDS) -> dict:
    reqs = run.requests
    rows = []
    for kind in kinds:
        fs = [f for f in run.faults if f.kind == kind]
        detect = [f.detect_s for f in fs if f.detect_s is not None]
        recover = [f.recover_s for f in fs if f.recover_s is not None]
        leaks = [f.leaked_processes for f in fs if f.leaked_processes is not None]
        rows.append({"fault": kind, "injected": len(fs), "requests affected": sum(f.affected for f in fs),
                     "detect s (mean)": round(statistics.mean(detect), 2) if detect else None,
                     "recover s (max)": round(max(recover), 2) if recover else None,
                     "not recovered": sum(f.recover_s is None for f in fs),
                     "processes leaked": sum(leaks) if leaks else None,                 # None: not checked
                     "failed checks": [c for f in fs for c in f.failed_checks]})
    notes = [f"{f.kind} at {f.at - run.started:.0f} s: {f.note}" for f in run.faults if f.note]
    return {"faults": rows, "requests": len(reqs), "answered": sum(r.status == 200 and not r.error for r in reqs),
            "clear errors": sum(r.endings == 1 and r.error is not None for r in reqs),
            "refused 503": sum(r.status == 503 for r in reqs), "lost": sum(r.lost or r.endings == 0 for r in reqs),
            "double endings": sum(r.endings > 1 for r in reqs), "wrong answers": run.wrong_answers,
            "cut short": sum(r.finish == "abort" for r in reqs),
            "pages leaked (kv usage)": run.leaked_pages, "leases leaked": run.leaked_leases, "notes": notes}


def print_summary(s: dict) -> None:
    cols = list(s["faults"][0])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for row in s["faults"]:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")
    print({k: v for k, v in s.items() if k != "faults"})


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.reliability.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--per-kind", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--ray-duration", type=float, default=180,
                    help="then the Ray part (tests/reliability/chaos_ray.py) for this long; 0: skip it")
    ap.add_argument("--log-dir", help="keep the servers' logs here (default: a temporary folder)")
    a = ap.parse_args()
    from dllm_server.model.tiny import make_tiny_model
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(a.log_dir or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        model = str(make_tiny_model(Path(tmp) / "tiny-sdar", arch="sdar", seed=1))
        reference = fault_free(model, logs, a.seed)
        out["processes"] = summary(chaos(model, a.duration, a.seed, logs, a.per_kind, reference))
        out["processes"].update(duration_s=a.duration)
        if a.ray_duration:
            from .chaos_ray import RAY_KINDS, chaos_ray
            out["ray"] = summary(chaos_ray(model, a.ray_duration, a.seed, logs, a.per_kind, reference), RAY_KINDS)
            out["ray"].update(duration_s=a.ray_duration)
    for part, s in out.items():
        s.update(seed=a.seed, machine=f"{os.cpu_count()} cores")
        print(f"## {part}")
        print_summary(s)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
