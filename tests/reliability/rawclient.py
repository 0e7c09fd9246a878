"""The overload's client: HTTP/1.1 written by hand on asyncio streams, one connection per request
(`Connection: close`). At 10x the server's capacity an httpx client in one Python process on the
same two cores was the weaker side: its own loop fell so far behind that thousands of its
connects timed out while the server answered a probe in 60 ms. This one costs a fraction of it
per request, so what is measured is the server."""
from __future__ import annotations

import asyncio
import json
import random

import numpy as np

from loadgen.arrivals import arrival_offsets
from loadgen.run import open_loop

from .traffic import Outcome, _good_body


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    return int(lines[0].split()[1]), headers


async def raw_request(host: str, port: int, kind: str, rng: random.Random, timeout_s: float) -> Outcome:
    out = Outcome(kind)
    path, body = _good_body(rng, stream=kind == "stream")
    data = json.dumps(body).encode()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            out.status, headers = await _read_head(reader)
            out.retry_after = headers.get("retry-after")
            rest = await reader.read()          # Connection: close: the body ends with the stream
            text = rest.decode("utf-8", "replace")
            if out.status == 200:
                finishes = text.split('"finish_reason":"')
                out.finish = finishes[-1].split('"')[0] if len(finishes) > 1 else None
                if kind == "stream" and "data: [DONE]" not in text:
                    out.error = "stream ended without [DONE]"
                if kind == "stream" and '"error"' in text.replace('"error":null', ""):
                    out.error = "stream error"
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        if writer is not None:
            writer.close()
    out.latency = loop.time() - t0
    return out


async def overload_traffic(url: str, rate: float, duration_s: float, seed: int = 7, stream_share: float = 0.5,
                           timeout_s: float = 60.0) -> list[Outcome]:
    """Open loop: Poisson arrivals at `rate` for `duration_s`, streamed and JSON completions."""
    host, port = url.removeprefix("http://").split(":")
    rng = random.Random(seed)
    offsets = [o for o in arrival_offsets("poisson", rate, int(rate * duration_s * 1.5) + 10,
                                          np.random.default_rng(seed)) if o < duration_s]
    kinds = ["stream" if rng.random() < stream_share else "json" for _ in offsets]
    return await open_loop(offsets, lambda i: raw_request(host, int(port), kinds[i],
                                                          random.Random(seed * 100_003 + i), timeout_s))
