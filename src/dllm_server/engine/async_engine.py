"""AsyncEngine: the front process's API over worker processes. `generate()` validates input
(ValueError names the field), then yields StreamEvents: one per committed step, then the final
output. Closing the iterator early (a disconnected client) aborts the request. Never touches
model tensors; the scheduler owns all request state."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from typing import Any, AsyncIterator

from ..config import ServerConfig
from ..decoding.params import SamplingParams, request_seed
from ..model.embedded import model_path
from ..model.loader import read_config
from .inputs import check_request, prompt_ids
from .placement import worker_roles
from .request_state import RequestState
from .scheduler import Entry, Scheduler, StreamEvent
from .tokenize import Tokenizer, stop_token_ids
from .worker_pool import WorkerPool

log = logging.getLogger(__name__)


class EngineOverloaded(Exception):
    """The bounded waiting queue is full, or the engine is draining (HTTP 503)."""


class EngineDead(Exception):
    """Workers are down and will not come back (restart disabled)."""


def check_gpu_count(placement: str, num_workers: int, num_gpus: int) -> None:
    """Workers that hand KV over (NCCL) need a GPU each: NCCL refuses two ranks on one device.
    Colocated workers share GPUs round-robin."""
    if placement != "colocated" and num_workers > num_gpus:
        raise ValueError(f"placement: {placement} on CUDA needs one GPU per worker for the NCCL KV "
                         f"handoff ({num_workers} workers, {num_gpus} GPUs); use fewer workers, more GPUs, "
                         f"colocated placement or --device cpu")


def _devices(config: ServerConfig, n: int) -> list[str]:
    import torch
    want = config.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError("device: cuda was requested but no CUDA device is available")
        check_gpu_count(config.placement, n, count)
        return [f"cuda:{i % count}" for i in range(n)]
    if want != "cpu":
        raise ValueError(f"device: must be cpu, cuda or auto, got {want!r}")
    return [want] * n


class AsyncEngine:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.path = model_path(config.model)
        read_config(self.path)            # a clear error now, not a worker traceback later
        self.tokenizer = None if config.skip_tokenizer_init else Tokenizer(self.path)
        self.roles = worker_roles(config.placement, config.num_workers, config.num_prefill_workers)
        self.devices = _devices(config, len(self.roles))     # a bad device setup fails here, clearly
        self.scheduler: Scheduler | None = None
        self.pool: WorkerPool | None = None
        self._arrivals = itertools.count()
        self.draining = False
        self.dead: str | None = None
        self.stop_ids: tuple[int, ...] = ()
        self.started_at = time.monotonic()
        self.started_wall = time.time()

    # ---- lifecycle ----
    async def start(self, timeout_s: float = 300.0) -> None:
        loop = asyncio.get_running_loop()
        self.scheduler = Scheduler(self.config, self.roles, self.tokenizer, self._send)
        self.pool = WorkerPool(self.config, str(self.path), self.roles, self.devices,
                               loop, self.scheduler.on_messages, self._on_death)
        self.pool.start_all()
        ready = asyncio.ensure_future(self.scheduler.ready_event.wait())
        failed = asyncio.ensure_future(self.scheduler.failed_event.wait())
        await asyncio.wait({ready, failed}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel(), failed.cancel()
        if not self.scheduler.ready_event.is_set():
            self.pool.stop(timeout_s=5)
            raise RuntimeError(self.scheduler.failure or f"workers not ready after {timeout_s:.0f} s")
        args = self.scheduler.model_args
        self.model_args = args
        self.stop_ids = stop_token_ids(self.path, args.eos_id, self.tokenizer)
        log.info("engine ready: %d worker(s), placement %s", len(self.roles), self.config.placement)

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop taking requests, let in-flight ones finish for up to `timeout_s` (0: abort them
        now, finish_reason "abort"), then stop and join every worker."""
        self.draining = True
        timeout_s = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while self.scheduler and self.scheduler.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.scheduler:
            for rid in list(self.scheduler.requests):
                self.scheduler.abort(rid)
        if self.pool:
            await asyncio.get_running_loop().run_in_executor(None, self.pool.stop)

    @property
    def is_ready(self) -> bool:
        return self.scheduler is not None and self.scheduler.ready_event.is_set() and not self.dead

    @property
    def is_healthy(self) -> bool:
        return self.is_ready and self.scheduler.is_healthy and not self.draining

    def _send(self, wid: int, msg) -> None:
        self.pool.send(wid, msg)

    def _on_death(self, wid: int, exitcode) -> None:
        reason = f"worker {wid} died (exit code {exitcode})"
        log.error(reason)
        if not self.scheduler.ready_event.is_set():
            self.scheduler.startup_failed(reason)
            return
        if self.config.restart_workers and not self.draining:
            ids = self.pool.restart(wid)
            self.scheduler.counters.worker_restarts += 1
            self.scheduler.on_worker_lost(ids, reason)
        else:
            self.dead = reason
            self.scheduler.on_worker_lost(list(range(len(self.roles))), reason)

    # ---- requests ----
    def prepare(self, prompt: Any = None, params: SamplingParams | None = None, messages: list[dict] | None = None,
                request_id: str | None = None) -> RequestState:
        """Validate and build the request state (ValueError names the field)."""
        params = params or SamplingParams()
        if messages is not None:
            if self.tokenizer is None:
                raise ValueError("messages: chat needs a tokenizer (skip_tokenizer_init is set)")
            text, ids = None, self.tokenizer.apply_chat_template(messages)
        else:
            text, ids = prompt_ids(prompt, self.tokenizer)
        seq = next(self._arrivals)
        resolved = params.resolve(self.config, request_seed(self.config.seed, seq))
        check_request(ids, resolved, self.model_args)
        state = RequestState(request_id or f"req-{uuid.uuid4().hex[:16]}", text, ids, resolved,
                             self.model_args.mask_id, self.stop_ids, seq)
        pages = self.scheduler.pages_for(state.canvas.numel())
        if pages > self.scheduler.min_capacity_pages():
            raise ValueError(f"max_tokens: a canvas of {state.canvas.numel()} tokens needs {pages} KV pages; "
                             f"a worker holds {self.scheduler.min_capacity_pages()}")
        return state

    def submit(self, state: RequestState, stream_text: bool = False, stream_canvas: bool = False) -> Entry:
        """Admit a prepared request (synchronously, so a refusal comes before any response)."""
        if self.dead:
            raise EngineDead(self.dead)
        if self.draining:
            raise EngineOverloaded("server is shutting down")
        if not self.is_ready:
            raise EngineOverloaded("engine is starting")
        if self.scheduler.num_waiting >= self.config.max_waiting_requests:
            raise EngineOverloaded(f"the request queue is full ({self.config.max_waiting_requests} waiting)")
        entry = Entry(state, asyncio.Queue(), stream_text, time.monotonic(), stream_canvas)
        self.scheduler.add(entry)
        return entry

    async def generate(self, state: RequestState | Entry, stream_text: bool = False) -> AsyncIterator[StreamEvent]:
        entry = state if isinstance(state, Entry) else self.submit(state, stream_text)
        state = entry.state
        finished = False
        try:
            while True:
                event = await entry.events.get()
                if event.output is not None:
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished:   # the consumer went away: free the worker's KV within an iteration
                self.scheduler.abort(state.request_id)

    async def run(self, prompt: Any = None, params: SamplingParams | None = None, **kw):
        """Convenience: the final output of one request."""
        return await self.run_state(self.prepare(prompt, params, **kw))

    async def run_state(self, state: RequestState):
        async for event in self.generate(state):
            if event.output is not None:
                return event.output
