"""SSE responses whose client must keep reading. A chunk the connection does not take within
`stall_timeout_s` (the socket's buffers are full: the client stopped reading) ends the stream:
`on_stall` aborts its requests (their KV is freed at once) and the connection is dropped, so a
stalled client costs neither worker time nor more than its buffers of front memory."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from starlette.responses import StreamingResponse

log = logging.getLogger(__name__)
# Where api/server.py's HTTP protocol puts the connection's abort in each request's scope state.
ABORT_CONNECTION = "dllm.abort_connection"


class GuardedStreamingResponse(StreamingResponse):
    def __init__(self, content, stall_timeout_s: float, on_stall: Callable[[], None], **kw):
        super().__init__(content, **kw)
        self.stall_timeout_s = stall_timeout_s
        self.on_stall = on_stall
        self.stalled = False
        self._abort_connection: Callable[[], None] | None = None

    async def __call__(self, scope, receive, send) -> None:
        self._abort_connection = scope.get("state", {}).get(ABORT_CONNECTION)
        await super().__call__(scope, receive, send)

    async def stream_response(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            try:
                await asyncio.wait_for(send({"type": "http.response.body", "body": chunk, "more_body": True}),
                                       self.stall_timeout_s)
            except asyncio.TimeoutError:
                await self._stall()
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stall(self) -> None:
        self.stalled = True
        log.warning("client read nothing for %.1f s: stream aborted, connection dropped", self.stall_timeout_s)
        self.on_stall()
        await self.body_iterator.aclose()
        if self._abort_connection is not None:
            # A plain close would wait for the unread buffer to flush, which never happens.
            self._abort_connection()
            await asyncio.sleep(0)      # let the server see the connection lost before we return
