"""Capacity at matched latency, for bench/gpu.py: the real server (HTTP front, worker process)
under an open-loop Poisson arrival from the load generator, once with the default scheduler and
once with the batch-1 baseline. Both face the same SLO: end-to-end latency within `slo_factor`
x the unloaded latency of one request on the baseline. The capacity of each is the highest rate
at which >= `target` of the requests meet it (loadgen's capacity search: double, then bisect),
so their ratio compares throughput at matched latency (the Sangam paper's capacity metric).
"""
from __future__ import annotations

import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

BASELINE = ("batch-1 baseline", ["--max-active-decodes", "1", "--token-budget", "none"])
DEFAULT = ("default scheduler", [])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(ckpt: Path, flags: list[str], device: str, dtype: str, block: int, log: Path,
           timeout_s: float) -> tuple[subprocess.Popen, str]:
    port = _port()
    cmd = [sys.executable, "-m", "dllm_server.cli", "serve", str(ckpt), "--port", str(port), "--device", device,
           "--dtype", dtype, "--skip-tokenizer-init", "--block-length", str(block), "--served-model-name", "bench",
           *flags]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-1500:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    _stop(proc)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f} s: {log.read_text()[-1500:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _unloaded_latency_s(url: str, body: dict, n: int = 3) -> float:
    times = []
    for _ in range(n + 1):                      # the first one warms up
        t = time.perf_counter()
        r = httpx.post(url + "/v1/completions", json=body, timeout=300)
        r.raise_for_status()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def capacity_comparison(ckpt: Path, args, sh, device: str, dtype: str, seconds_left, seed: int, workdir: Path,
                        slo_factor: float = 4.0, target: float = 0.9, tolerance: float = 0.15) -> dict:
    hi = min(args.vocab_size, args.mask_id, args.eos_id)
    rng = random.Random(seed)
    body = {"model": "bench", "prompt": [rng.randrange(1, hi) for _ in range(sh.serve_prompt)],
            "max_tokens": sh.serve_max_tokens, "steps": sh.serve_steps, "ignore_eos": True, "temperature": 0.0}
    out: dict = {"method": f"open loop, Poisson arrivals; SLO: e2e latency <= {slo_factor:g} x the baseline's "
                           f"unloaded latency for >= {target:.0%} of requests; capacity = highest passing rate "
                           f"(bracket tolerance {tolerance:.0%})",
                 "params": {k: body[k] for k in ("max_tokens", "steps", "ignore_eos")} | {"prompt_len": sh.serve_prompt},
                 "runs": {}}
    slo_ms = None
    for name, flags in (BASELINE, DEFAULT):
        if seconds_left() < 20:
            out["skipped"] = f"time: {seconds_left():.0f} s left before {name}"
            return out
        t = time.perf_counter()
        proc, url = _start(ckpt, flags, device, dtype, sh.block, workdir / f"server-{len(out['runs'])}.log",
                           timeout_s=min(180.0, seconds_left()))
        try:
            start_s = time.perf_counter() - t
            one = _unloaded_latency_s(url, body)
            if slo_ms is None:
                slo_ms = slo_factor * one * 1e3
                out.update({"baseline_unloaded_latency_s": one, "slo_e2e_ms": slo_ms})
            result_dir = workdir / name.replace(" ", "-")
            cmd = [sys.executable, "-m", "loadgen", "--base-url", url, "--model", "bench", "--endpoint", "completions",
                   "--dataset", "random", "--random-ids", "--vocab-size", str(hi), "--id-low", "1",
                   "--prompt-len", str(sh.serve_prompt), "--output-len", str(sh.serve_max_tokens), "--ignore-eos",
                   "--extra-body", json.dumps({"steps": sh.serve_steps}), "--seed", str(seed),
                   "--num-prompts", str(sh.capacity_prompts), "--capacity-search", "--goodput", f"e2el:{slo_ms:.0f}",
                   "--capacity-target", str(target), "--capacity-start-rate", f"{0.5 / one:.4g}",
                   "--capacity-max-rate", f"{64 / one:.4g}", "--capacity-tolerance", str(tolerance),
                   "--result-dir", str(result_dir), "--label", "cap", "--no-plots", "--no-progress", "--quiet"]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30.0, seconds_left()))
            if run.returncode != 0:
                raise RuntimeError(f"loadgen exited {run.returncode}: {run.stdout[-800:]} {run.stderr[-1500:]}")
            found = json.loads((result_dir / "cap-capacity.json").read_text())
            out["runs"][name] = {"capacity_req_s": found["capacity"], "upper_req_s": found["upper"],
                                 "bracketed": found["bracketed"], "probes": len(found["history"]),
                                 "unloaded_latency_s": one, "server_start_s": start_s,
                                 "history": [{"rate": h["rate"], "ok": h["ok"],
                                              "goodput_fraction": h["goodput_fraction"]} for h in found["history"]]}
        finally:
            _stop(proc)
    base, dflt = (out["runs"][n]["capacity_req_s"] for n, _ in (BASELINE, DEFAULT))
    out["capacity_ratio"] = dflt / base if base and dflt else None
    return out
