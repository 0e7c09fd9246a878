"""`dllm-server serve`: uvicorn around the app. The port is bound before the workers start, so
/health answers 503 (not "connection refused") while they load. SIGTERM drains: new requests get
503, in-flight ones finish for up to shutdown_timeout_s (0: aborted at once, finish_reason
"abort"), then every worker is stopped and joined. A second signal exits at once."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import time

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..checkpoint import served_name
from ..config import ServerConfig, TestHooks
from ..engine.async_engine import AsyncEngine
from .app import build_app
from .stream_guard import ABORT_CONNECTION

log = logging.getLogger("dllm_server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, drain_s: float):
        super().__init__(config)
        self.engine = engine
        self.drain_s = drain_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    def handle_exit(self, sig, frame) -> None:
        if self._draining or self.loop is None:
            self.should_exit = True
            self.force_exit = self._draining
            return
        self._draining = True
        self.engine.draining = True
        log.info("signal %s: draining for up to %.1f s", sig, self.drain_s)
        self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        if await self.engine.drain(self.drain_s):
            await asyncio.sleep(0.2)    # let the final chunks of aborted streams go out
        self.should_exit = True


class DroppableH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus a way for a request to drop its connection at once (a stalled
    SSE client, api/stream_guard.py): its transport's abort, in every request's scope state; and
    a fixed kernel send buffer, so that a client that stops reading backs up into the server's
    writes after at most that much (autotuning lets it grow to megabytes, which a whole stream
    fits in: the stall would never show)."""
    send_buffer_bytes = 0           # 0: the kernel's default (autotuned)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.app_state = {**self.app_state, ABORT_CONNECTION: transport.abort}
        sock = transport.get_extra_info("socket")
        if self.send_buffer_bytes and sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)


def _raise_open_files_limit() -> None:
    """Every connection is a file descriptor: take the hard limit, so a burst of connections
    is not refused at a soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


STATS_INTERVAL_S = 10.0


def _log_stats(engine: AsyncEngine, interval_s: float, last_positions: int) -> int:
    """One line of engine state while there is work (silent when idle)."""
    s = engine.stats()
    positions = s.counters.canvas_positions
    if s.num_requests or positions != last_positions:
        log.info("running %d, waiting %d, %.0f positions/s through the model, KV pages %.1f%% used, "
                 "workers up %d/%d", s.num_running, s.num_waiting, (positions - last_positions) / interval_s,
                 100 * s.kv_usage, s.workers_up, len(s.workers))
    return positions


def run_server(config: ServerConfig, hooks: TestHooks | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _raise_open_files_limit()
    engine = AsyncEngine(config, hooks=hooks)
    model_name = config.served_model_name or served_name(config.model, engine.path)
    exit_code = {"code": 0}
    server: DrainingServer | None = None

    async def start_and_watch() -> None:
        try:
            await engine.start()
        except Exception as exc:
            log.error("engine failed to start: %s", exc)
            exit_code["code"] = 1
            server.should_exit = True
            return
        log.info("serving %s on http://%s:%d", model_name, config.host, config.port)
        last_log, last_positions = time.monotonic(), 0
        while not server.should_exit:
            if engine.dead:      # restart disabled: exit non-zero so an orchestrator restarts us
                log.error("engine is dead (%s); exiting", engine.dead)
                exit_code["code"] = 1
                server.should_exit = True
            now = time.monotonic()
            if now - last_log >= STATS_INTERVAL_S:
                last_positions = _log_stats(engine, now - last_log, last_positions)
                last_log = now
            await asyncio.sleep(0.2)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        server.loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(start_and_watch())
        try:
            yield
        finally:
            task.cancel()
            await engine.shutdown(0)
            log.info("all workers stopped")

    app = build_app(engine, model_name, lifespan=lifespan)
    protocol = type("ServerProtocol", (DroppableH11Protocol,), {"send_buffer_bytes": config.socket_send_buffer_bytes})
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level="info", http=protocol,
                               timeout_graceful_shutdown=5, access_log=False)
    server = DrainingServer(uv_config, engine, config.shutdown_timeout_s)
    server.run()
    return exit_code["code"]
