"""A request's events for its consumer, in bounded memory at any reading pace: a newer text event replaces a queued
one; past `max_events` progress events, `on_overflow` is called once, soon after. The final output is always kept."""
from __future__ import annotations

import asyncio
import collections
from typing import Callable

from .events import StreamEvent


class StreamBuffer:
    def __init__(self, max_events: int, on_overflow: Callable[[], None] | None = None):
        self.max_events = max_events
        self.on_overflow = on_overflow
        self.overflowed = False
        self._items: collections.deque[StreamEvent] = collections.deque()
        self._ready = asyncio.Event()

    def put_nowait(self, event: StreamEvent) -> None:
        items = self._items
        if event.output is None:
            if self.overflowed:
                return
            if event.delta is None and items and items[-1].delta is None and items[-1].output is None:
                items[-1] = event
                return
            if len(items) >= self.max_events:
                self.overflowed = True
                if self.on_overflow is not None:
                    asyncio.get_running_loop().call_soon(self.on_overflow)
                return
        items.append(event)
        self._ready.set()

    async def get(self) -> StreamEvent:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

    def qsize(self) -> int:
        return len(self._items)
