"""Capacity at matched latency, for bench/gpu.py: the real server under loadgen's open-loop Poisson
arrivals, with the default scheduler and with the batch-1 baseline, both against one SLO."""
from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.gpu_harness import file_tail
from bench.gpu_parts import prompt_id_range
from bench.harness import Timer, start_server
from dllm_server.server_process import ServerProcess

BASELINE = ("batch-1 baseline", ["--max-active-decodes", "1", "--token-budget", "none"])
DEFAULT = ("default scheduler", [])
START_FACTOR, MAX_FACTOR = 0.5, 64.0   # search rates, in units of 1 / unloaded latency
MIN_PROMPTS = 8                        # fewer requests per probe say little about a 90 % target
STOP_S = 15.0                          # kept for stopping a server
MIN_CONFIG_S = 20.0                    # below this a configuration is skipped, not started
NOTABLE = re.compile(r"captured|error|traceback|warning|exception|killed|out of memory", re.I)
LOCAL = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def search_estimate_s(one_s: float, prompts: int, tolerance: float) -> float:
    """A generous bound on one capacity search. The first probe alone takes prompts / rate =
    2 x prompts x one; doubling from there adds less than that again; under the batch-1 baseline
    every later probe takes >= prompts x one (serial service), and the bisection adds
    log2(1 / tolerance) such probes at a slightly lower rate; each probe also drains (<= the SLO,
    4 x one, when it passes)."""
    bisect = math.ceil(math.log2(1 / tolerance))
    probes = math.ceil(math.log2(MAX_FACTOR / START_FACTOR)) + 1 + bisect
    return one_s * (prompts * (4 + 1.4 * bisect) + 4 * probes)


def plan_prompts(one_s: float, seconds: float, most: int, tolerance: float) -> int | None:
    """Requests per probe: as many as `most` if the search fits `seconds`, else fewer, down to
    MIN_PROMPTS; None when even that does not fit."""
    for n in range(most, MIN_PROMPTS - 1, -1):
        if search_estimate_s(one_s, n, tolerance) <= seconds:
            return n
    return None


def probes_so_far(result_dir: Path, target: float) -> list[dict]:
    """The probes a search cut short had finished (loadgen writes one file per probe)."""
    history = []
    for f in sorted(result_dir.glob("cap-capacity-rate*.json"), key=lambda p: p.stat().st_mtime):
        try:
            r = json.loads(f.read_text())
            frac = r["summary"]["goodput"]["fraction"]
            history.append({"rate": float(r["config"]["request_rate"]), "ok": frac >= target,
                            "goodput_fraction": frac})
        except (ValueError, KeyError, TypeError):
            continue
    return history


def bounds(history: list[dict]) -> dict:
    ok = [h["rate"] for h in history if h["ok"]]
    bad = [h["rate"] for h in history if not h["ok"]]
    return {"capacity": max(ok) if ok else None, "upper": min(bad) if bad else None, "bracketed": bool(ok and bad)}


def _start(ckpt: Path, flags: list[str], device: str, dtype: str, block: int, log: Path,
           timeout_s: float) -> ServerProcess:
    return start_server(ckpt, "--device", device, "--dtype", dtype, "--skip-tokenizer-init", "--block-length",
                        str(block), "--served-model-name", "bench", *flags, log_path=log, timeout_s=timeout_s)


def _stop(server: ServerProcess, wait_s: float = STOP_S) -> None:
    """SIGTERM (the server drains and stops its workers), then SIGKILL to its whole session, so
    no worker process is left holding the GPU."""
    server.stop(timeout=wait_s)


def unloaded_latency_s(url: str, body: dict, deadline: float, n: int = 3) -> float:
    """Median of n requests one at a time after a warm-up; each request's timeout is the time
    left, so this never outlives the deadline."""
    times = []
    with httpx.Client(trust_env=False) as client:
        for _ in range(n + 1):                          # the first one warms up
            left = deadline - time.monotonic()
            if left <= 1:
                if len(times) >= 2:
                    break
                raise TimeoutError("no time left for the unloaded latency")
            with Timer() as t:
                r = client.post(url + "/v1/completions", json=body, timeout=left)
                r.raise_for_status()
            times.append(t.s)
    return statistics.median(times[1:])


def _search(url: str, sh, ids: tuple[int, int], seed: int, slo_ms: float, one: float, prompts: int, target: float,
            tolerance: float, result_dir: Path, timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "loadgen", "--base-url", url, "--model", "bench", "--endpoint", "completions",
           "--dataset", "random", "--random-ids", "--vocab-size", str(ids[1]), "--id-low", str(ids[0]),
           "--prompt-len", str(sh.serve_prompt), "--output-len", str(sh.serve_max_tokens), "--ignore-eos",
           "--extra-body", json.dumps({"steps": sh.serve_steps}), "--seed", str(seed),
           "--num-prompts", str(prompts), "--capacity-search", "--goodput", f"e2el:{slo_ms:.0f}",
           "--capacity-target", str(target), "--capacity-start-rate", f"{START_FACTOR / one:.4g}",
           "--capacity-max-rate", f"{MAX_FACTOR / one:.4g}", "--capacity-tolerance", str(tolerance),
           "--result-dir", str(result_dir), "--label", "cap", "--no-plots", "--no-progress", "--quiet"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **LOCAL})
    except subprocess.TimeoutExpired:
        history = probes_so_far(result_dir, target)
        return {**bounds(history), "history": history, "partial": True,
                "note": f"search cut at {timeout_s:.0f} s (the time left); probes finished so far"}
    if run.returncode != 0:
        raise RuntimeError(f"loadgen exited {run.returncode}: {run.stdout[-800:]} {run.stderr[-1500:]}")
    found = json.loads((result_dir / "cap-capacity.json").read_text())
    return {"capacity": found["capacity"], "upper": found["upper"], "bracketed": found["bracketed"],
            "history": [{"rate": h["rate"], "ok": h["ok"], "goodput_fraction": h["goodput_fraction"]}
                        for h in found["history"]], "partial": False}


def _logs(rec: dict, log: Path) -> None:
    text = file_tail(log, 200_000)
    rec["server_log_notes"] = [ln[:300] for ln in text.splitlines() if NOTABLE.search(ln)][-40:]
    rec["server_log_tail"] = text[-3000:]


def capacity_comparison(ckpt: Path, args, sh, device: str, dtype: str, seconds_left, seed: int, workdir: Path,
                        slo_factor: float = 4.0, target: float = 0.9, tolerance: float = 0.15,
                        configs=(BASELINE, DEFAULT)) -> dict:
    """The SLO: end-to-end latency within `slo_factor` x the unloaded latency of one request on the
    first configuration (the baseline). A configuration's capacity is the highest rate at which >=
    `target` of the requests meet it (loadgen's capacity search: double, then bisect), so the ratio
    compares throughput at matched latency (the Sangam paper's capacity metric). Each configuration
    keeps its own result, error or skip note; every wait is bounded by `seconds_left()`, and the
    search shrinks its probes to fit it."""
    ids = prompt_id_range(args)
    rng = random.Random(seed)
    body = {"model": "bench", "prompt": [rng.randrange(*ids) for _ in range(sh.serve_prompt)],
            "max_tokens": sh.serve_max_tokens, "steps": sh.serve_steps, "ignore_eos": True, "temperature": 0.0}
    out: dict = {"method": f"open loop, Poisson arrivals; SLO: e2e latency <= {slo_factor:g} x the baseline's "
                           f"unloaded latency for >= {target:.0%} of requests; capacity = highest passing rate "
                           f"(bracket tolerance {tolerance:.0%})",
                 "params": {k: body[k] for k in ("max_tokens", "steps", "ignore_eos")}
                 | {"prompt_len": sh.serve_prompt},
                 "runs": {}, "failed": {}, "skipped": {}}
    slo_ms = None
    for i, (name, flags) in enumerate(configs):
        share = seconds_left() / (len(configs) - i)    # what the earlier ones left over flows on
        if share < MIN_CONFIG_S:
            out["skipped"][name] = f"time: {seconds_left():.0f} s left, this configuration's share {share:.0f} s"
            continue
        deadline = time.monotonic() + share
        rec: dict = {}
        log = workdir / f"server-{i}.log"
        proc = None
        try:
            with Timer() as t:
                proc = _start(ckpt, flags, device, dtype, sh.block, log, min(180.0, share - STOP_S))
            url = proc.url
            rec["server_start_s"] = t.s
            rec["unloaded_latency_s"] = one = unloaded_latency_s(url, body, deadline - STOP_S)
            if slo_ms is None:                 # the baseline's, unless it failed before measuring
                slo_ms = slo_factor * one * 1e3
                out.update({"baseline_unloaded_latency_s": one, "slo_e2e_ms": slo_ms, "slo_from": name})
            search_s = deadline - time.monotonic() - STOP_S
            prompts = plan_prompts(one, search_s, sh.capacity_prompts, tolerance)
            if prompts is None:
                out["skipped"][name] = (f"time: {search_s:.0f} s left for the search, {MIN_PROMPTS} requests per "
                                        f"probe need ~{search_estimate_s(one, MIN_PROMPTS, tolerance):.0f} s")
                continue
            rec.update({"prompts_per_probe": prompts, "search_estimate_s": search_estimate_s(one, prompts, tolerance)})
            found = _search(url, sh, ids, seed, slo_ms, one, prompts, target, tolerance,
                            workdir / name.replace(" ", "-"), max(1.0, search_s))
            rec.update({"capacity_req_s": found.pop("capacity"), "upper_req_s": found.pop("upper"),
                        "probes": len(found["history"]), **found})
            out["runs"][name] = rec
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            out["failed"][name] = rec
        finally:
            if proc is not None:
                _stop(proc, min(STOP_S, max(3.0, deadline - time.monotonic())))
            _logs(rec, log)
    caps = [out["runs"].get(n, {}).get("capacity_req_s") for n, _ in configs]
    out["capacity_ratio"] = caps[1] / caps[0] if len(caps) >= 2 and all(caps[:2]) else None    # default / batch-1
    if len(caps) > 2 and caps[1] and caps[2]:
        out["tp_capacity_ratio"] = caps[2] / caps[1]          # one TP instance / one TP=1 instance
    return out
