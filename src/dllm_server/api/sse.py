"""Server-sent events framing: `data: <json>\n\n`, `data: [DONE]\n\n`, keep-alive comments."""
from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

DONE = b"data: [DONE]\n\n"
KEEP_ALIVE = b": keep-alive\n\n"


def frame(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


async def with_keep_alive(events: AsyncIterator[bytes], interval_s: float) -> AsyncIterator[bytes]:
    """Forward `events`, sending an SSE comment after each `interval_s` of silence so proxies do
    not cut a stream that is queued or denoising. The pending read is never cancelled by a tick."""
    it = events.__aiter__()
    pending = asyncio.ensure_future(it.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield KEEP_ALIVE
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            yield chunk
            pending = asyncio.ensure_future(it.__anext__())
    finally:
        if not pending.done():
            # The read runs in a task of its own: let the cancellation land before closing the
            # generator, which is still running inside that task until it does ("aclose():
            # asynchronous generator is already running", once per client that left mid-stream).
            pending.cancel()
            await asyncio.wait({pending})
        if not pending.cancelled():
            pending.exception()         # retrieved (StopAsyncIteration or a failure already raised)
        await it.aclose()
