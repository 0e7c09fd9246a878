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


async def kill_resumes(engine, pid: int, tasks: list, n: int, max_tokens: int = 200) -> list:
    """SIGKILL `pid` (a rank of a worker) under `slow_requests(engine, n, max_tokens)`: no request fails, some
    were resumed elsewhere or after the restart, and every answer equals the same request's without a fault
    (asked again once the engine is healthy; greedy, so the seed does not matter). Returns the outputs."""
    import asyncio
    import os
    import signal
    os.kill(pid, signal.SIGKILL)
    done, pending = await asyncio.wait(tasks, timeout=180)
    assert not pending, f"{len(pending)} requests never ended"
    outs = [t.result() for t in tasks]
    assert all(o.finish_reason == "length" for o in outs), [o.error for o in outs if o.error][:3]
    assert engine.stats().counters.requests_resumed >= 1
    await recovers(engine, requests=2)
    again, _ = slow_requests(engine, n, max_tokens)
    assert [o.token_ids for o in await asyncio.gather(*again)] == [o.token_ids for o in outs]
    return outs


async def stop_is_found(engine, pid: int, timeout_s: float) -> float:
    """SIGSTOP `pid` (a hang, not a death): the watchdog counts it within its `timeout_s` + 5 s. Returns the
    seconds that took."""
    import asyncio
    import os
    import signal
    import time
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    while engine.stats().counters.worker_hangs == 0 and time.monotonic() - stopped_at < timeout_s + 30:
        await asyncio.sleep(0.05)
    detected_s = time.monotonic() - stopped_at
    assert engine.stats().counters.worker_hangs == 1 and detected_s < timeout_s + 5.0, detected_s
    return detected_s


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
