"""Front-process CPU per streamed denoising step: N concurrent SSE streams of long answers through
a real `dllm-server serve` (one worker), one commit per step (`steps = max_tokens`), so every
stream sees max_tokens steps. The front's CPU seconds (user + system of the server process
alone, from /proc; the worker is a separate process) over the load, divided by the denoising
steps the server ran (its own `dllm:denoising_steps` counter).

    python bench/front_cpu.py [--streams 64] [--max-tokens 512] [--model DIR]

Self-contained (no helpers from the package) so bench/ab.py can run it against older trees.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


def counter(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}_total{{[^}}]*}} (\S+)$", text, re.M))


async def stream_all(url: str, n: int, max_tokens: int, progress: bool) -> tuple[int, int]:
    async def one(i: int, client: httpx.AsyncClient) -> tuple[int, int]:
        body = {"prompt": f"stream {i}: the quick brown fox", "max_tokens": max_tokens, "steps": max_tokens,
                "ignore_eos": True, "stream": True, "seed": i, "temperature": 0.7}
        if progress:
            body["stream_options"] = {"include_progress": True}
        chunks = chars = 0
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    c = json.loads(line[6:])
                    if c.get("choices"):
                        chars += len(c["choices"][0].get("text") or "")
        return chunks, chars

    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=n)) as client:
        res = await asyncio.gather(*[one(i, client) for i in range(n)])
    return sum(r[0] for r in res), sum(r[1] for r in res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--progress", action="store_true", help="also stream the denoising progress chunks")
    args = ap.parse_args()
    from dllm_server.model.tiny import make_tiny_model
    path = args.model or str(make_tiny_model(tempfile.mkdtemp(), arch="llada", hidden=64, layers=2, heads=4,
                                             mlp=128, seed=0))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "dllm_server.cli", "serve", path, "--port", str(port),
                               "--dtype", "float32", "--threads-per-worker", "1",
                               "--max-active-decodes", str(max(64, args.streams))],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit("server did not become healthy")
            time.sleep(0.3)
        asyncio.run(stream_all(url, 2, 32, args.progress))            # warm-up
        steps0, cpu0, t0 = counter(url, "dllm:denoising_steps"), cpu_seconds(server.pid), time.perf_counter()
        chunks, chars = asyncio.run(stream_all(url, args.streams, args.max_tokens, args.progress))
        wall, cpu = time.perf_counter() - t0, cpu_seconds(server.pid) - cpu0
        steps = counter(url, "dllm:denoising_steps") - steps0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    per_step_us = 1e6 * cpu / steps
    print(f"{args.streams} streams x {args.max_tokens} tokens, one commit per step, progress={args.progress}: "
          f"{steps:.0f} steps in {wall:.1f} s, {chunks} SSE chunks, {chars} characters streamed")
    print(f"front process CPU {cpu:.2f} s ({100 * cpu / wall:.0f} % of one core), "
          f"{per_step_us:.1f} us per streamed step")
    print("RESULT " + json.dumps({"front_cpu_s": round(cpu, 3), "steps": int(steps), "wall_s": round(wall, 2),
                                  "us_per_step": round(per_step_us, 2), "sse_chunks": chunks}))


if __name__ == "__main__":
    main()
