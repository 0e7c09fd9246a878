"""Front-process CPU per streamed denoising step: N concurrent SSE streams of long answers (one commit
per step) through a real `dllm-server serve`, the server process's CPU seconds over its step counter.

    python -m bench.front_cpu [--streams 64] [--max-tokens 512] [--model DIR] [--progress]
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile

import httpx

from bench.harness import Timer, parser, result, server


def cpu_seconds(pid: int) -> float:
    """User + system seconds of that process alone (the worker is a separate process)."""
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
    ap = parser(__doc__, model="checkpoint (default: a seeded random 2-layer d=64 LLaDA)")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--progress", action="store_true", help="also stream the denoising progress chunks")
    args = ap.parse_args()
    from dllm_server.model.tiny import make_tiny_model
    path = args.model or str(make_tiny_model(tempfile.mkdtemp(), arch="llada", hidden=64, layers=2, heads=4,
                                             mlp=128, seed=0))
    with server(path, "--dtype", "float32", "--threads-per-worker", "1",
                "--max-active-decodes", str(max(64, args.streams))) as s:
        asyncio.run(stream_all(s.url, 2, 32, args.progress))            # warm-up
        steps0, cpu0 = counter(s.url, "dllm:denoising_steps"), cpu_seconds(s.pid)
        with Timer() as t:
            chunks, chars = asyncio.run(stream_all(s.url, args.streams, args.max_tokens, args.progress))
        wall, cpu = t.s, cpu_seconds(s.pid) - cpu0
        steps = counter(s.url, "dllm:denoising_steps") - steps0
    per_step_us = 1e6 * cpu / steps
    print(f"{args.streams} streams x {args.max_tokens} tokens, one commit per step, progress={args.progress}: "
          f"{steps:.0f} steps in {wall:.1f} s, {chunks} SSE chunks, {chars} characters streamed")
    print(f"front process CPU {cpu:.2f} s ({100 * cpu / wall:.0f} % of one core), "
          f"{per_step_us:.1f} us per streamed step")
    result({"front_cpu_s": round(cpu, 3), "steps": int(steps), "wall_s": round(wall, 2),
            "us_per_step": round(per_step_us, 2), "sse_chunks": chunks})


if __name__ == "__main__":
    main()
