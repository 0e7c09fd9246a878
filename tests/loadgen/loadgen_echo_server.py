"""A minimal, independent OpenAI-style streaming server for the load generator's tests.

Streams ``max_tokens`` one-word chunks ("w0 ", "w1 ", ...) for /v1/completions and
/v1/chat/completions with SSE, a keep-alive comment, dLLM progress chunks (``choices: []`` plus a
``dllm`` field: one before the first content, one after it), a final usage chunk and ``[DONE]``.
Also /v1/models, /version and a Prometheus /metrics with ``dllm:`` counters. Knobs make some
requests fail (HTTP 400 with an OpenAI error body, or an error event mid-stream).
Runs uvicorn in a daemon thread on a free 127.0.0.1 port.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route


@dataclass
class EchoState:
    first_delay: float = 0.05        # seconds between the first progress chunk and content
    chunk_delay: float = 0.004
    fail_every: int = 0              # every k-th request -> HTTP 400
    stream_error_every: int = 0      # every k-th request -> error event after 2 chunks
    usage_offset: int = 0            # lie about completion_tokens by this much
    send_metrics: bool = True
    requests: int = 0
    tokens: int = 0
    bodies: list = field(default_factory=list)
    auth: list = field(default_factory=list)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def make_app(state: EchoState) -> Starlette:
    async def models(_: Request):
        return JSONResponse({"object": "list", "data": [{"id": "echo-model", "object": "model"}]})

    async def version(_: Request):
        return JSONResponse({"version": "echo-0.1"})

    async def metrics(_: Request):
        if not state.send_metrics:
            return PlainTextResponse("not found", status_code=404)
        return PlainTextResponse(
            "# HELP dllm:requests_total Requests received.\n# TYPE dllm:requests_total counter\n"
            f"dllm:requests_total {float(state.requests)}\n"
            "# HELP dllm:generation_tokens_total Tokens generated.\n"
            "# TYPE dllm:generation_tokens_total counter\n"
            f'dllm:generation_tokens_total{{model="echo-model"}} {float(state.tokens)}\n'
            "# TYPE dllm:running gauge\ndllm:running 1.0\n"
            "# HELP other_requests_total Not ours.\n# TYPE other_requests_total counter\n"
            f"other_requests_total {float(state.requests)}\n")

    async def complete(request: Request):
        body = await request.json()
        state.requests += 1
        idx = state.requests
        state.bodies.append(body)
        state.auth.append(request.headers.get("authorization"))
        if state.fail_every and idx % state.fail_every == 0:
            return JSONResponse({"error": {"message": "prompt too long: 9999 > 4096 tokens",
                                           "type": "invalid_request_error", "code": 400}},
                                status_code=400)
        chat = request.url.path.endswith("/chat/completions")
        n_out = int(body.get("max_tokens", 16))
        broken = bool(state.stream_error_every and idx % state.stream_error_every == 0)
        rid, created = f"cmpl-{idx}", int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text, finish=None, role=False):
            if chat:
                delta = {"role": "assistant", "content": ""} if role else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            return {"id": rid, "object": kind, "created": created, "model": "echo-model",
                    "choices": [choice]}

        async def events():
            yield ": keep-alive\n\n"
            yield _sse({"id": rid, "object": kind, "choices": [], "dllm": {"step": 0}})
            await asyncio.sleep(state.first_delay)
            if chat:
                yield _sse(chunk("", role=True))
            for k in range(n_out):
                if broken and k == 2:
                    yield _sse({"error": {"message": "worker 0 died", "code": 500}})
                    return
                yield _sse(chunk(f"w{k} "))
                state.tokens += 1
                if k == 0:
                    yield _sse({"id": rid, "object": kind, "choices": [], "dllm": {"step": 1}})
                await asyncio.sleep(state.chunk_delay)
            yield _sse(chunk("", finish="length"))
            if (body.get("stream_options") or {}).get("include_usage"):
                plen = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 5
                yield _sse({"id": rid, "object": kind, "choices": [],
                            "usage": {"prompt_tokens": plen,
                                      "completion_tokens": n_out + state.usage_offset,
                                      "total_tokens": plen + n_out + state.usage_offset}})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[
        Route("/v1/models", models), Route("/version", version), Route("/metrics", metrics),
        Route("/v1/completions", complete, methods=["POST"]),
        Route("/v1/chat/completions", complete, methods=["POST"])])


class EchoServer:
    """uvicorn in a daemon thread; ``url`` is ``http://127.0.0.1:PORT``."""

    def __init__(self, state: EchoState | None = None):
        self.state = state or EchoState()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(make_app(self.state), log_level="warning", lifespan="off",
                                access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> "EchoServer":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("echo server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()
