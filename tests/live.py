"""Helpers for tests of a live AsyncEngine: real worker processes over their channels, gloo for KV."""
from __future__ import annotations

import contextlib

from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine


@contextlib.asynccontextmanager
async def running(config: ServerConfig, hooks=None):
    engine = AsyncEngine(config, hooks=hooks)
    await engine.start(timeout_s=120)
    try:
        yield engine
    finally:
        await engine.shutdown(0)


def slow_requests(engine, n: int, max_tokens: int = 200) -> tuple[list, dict]:
    """n requests that take a while (one token per forward), and when each one ended."""
    import asyncio
    import time

    from dllm_server import SamplingParams
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, steps=max_tokens)
    tasks = [asyncio.ensure_future(engine.run({"prompt_token_ids": [i + 1, 3]}, params)) for i in range(n)]
    ended: dict = {}
    for i, t in enumerate(tasks):
        t.add_done_callback(lambda _, i=i: ended.setdefault(i, time.monotonic()))
    return tasks, ended


async def kill_fails_fast(pid: int, tasks: list, ended: dict, within_s: float = 5.0) -> list:
    """SIGKILL `pid` (a rank of worker 0): every request ends, those that fail say worker 0 died,
    and they fail within `within_s` of the kill. Returns the outputs."""
    import asyncio
    import os
    import signal
    import time
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    await asyncio.wait(tasks, timeout=120)
    outs = [t.result() for t in tasks]
    errors = [i for i, o in enumerate(outs) if o.finish_reason == "error"]
    assert errors and all("worker 0 died" in outs[i].error for i in errors)
    assert all(o.finish_reason in ("length", "error") for o in outs)
    assert max(ended[i] for i in errors) - killed_at < within_s
    return outs


async def recovers(engine, timeout_s: float = 60.0, requests: int = 8) -> None:
    """The engine is healthy again within `timeout_s` and serves new requests."""
    import asyncio
    import time

    from dllm_server import SamplingParams
    deadline = time.monotonic() + timeout_s
    while not engine.is_healthy and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert engine.is_healthy
    more = await asyncio.gather(*[engine.run({"prompt_token_ids": [5, i + 1]}, SamplingParams(max_tokens=16))
                                  for i in range(requests)])
    assert all(o.finish_reason in ("stop", "length") for o in more)
