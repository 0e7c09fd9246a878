"""AsyncEngine: the front process's one engine surface (prepare, submit, generate, abort, drain, stats), used by
the API, tests and benchmarks. Never touches model tensors; the scheduler owns all request state."""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator

from ..checkpoint import head_counts, model_path, read_config, request_defaults
from ..config import ServerConfig, TestHooks
from ..decoding.params import SamplingParams, request_seed
from ..devices import worker_devices
from ..messages import LoadReport, ModelInfo
from ..request.inputs import check_prompt_chars, check_request, input_chars, prompt_ids
from ..scheduler.placement import worker_roles
from ..cluster.layout import Layout
from ..policy import make_policy
from ..policy.base import DecodePolicy
from ..costmodel.worker_speed import WorkerLoadModel
from ..request.state import GenerationOutput, RequestState
from ..request.events import STREAM_NONE, StreamEvent
from ..scheduler.request_table import Entry
from .handle import RequestHandle
from .regroups import ServerRegroups
from ..scheduler.scheduler import Scheduler
from .stats import EngineStats, snapshot
from ..request.stream_buffer import StreamBuffer
from ..request.tokenize import Tokenizer, stop_token_ids
from ..executor.watchdog import Watchdog
from ..executor.worker_pool import WorkerPool
from ..structured.grammars import Grammars

log = logging.getLogger(__name__)
OFFLOAD_CHARS = 2048    # shorter inputs tokenize faster than the hop to the tokenize thread
RESTART_RETRY_S = 5.0   # a restart that failed (no place for the worker yet) is tried again after this


class EngineOverloaded(Exception):
    """The bounded waiting queue is full, or the engine is draining (HTTP 503)."""


class EngineDead(Exception):
    """Workers are down and will not come back (restart disabled)."""


class AsyncEngine:
    def __init__(self, config: ServerConfig, policy: DecodePolicy | None = None, hooks: TestHooks | None = None):
        self.config = config
        self.hooks = hooks          # the test suite's fault injection; None when serving
        self.path = model_path(config.model, config.revision, config.download_dir)
        cfg = read_config(self.path)
        config.check_model_heads(*head_counts(cfg, config.model or str(self.path)))   # a clear error now, not in a worker
        self.generation_config, self.sampling_defaults = request_defaults(self.path, config.generation_config)
        self.tokenizer = None if config.skip_tokenizer_init else Tokenizer(self.path)
        self.load = WorkerLoadModel(config.block_length)
        self.policy = policy or make_policy(config, self.path, self.load)
        self.roles = worker_roles(config.placement, config.num_workers, config.num_prefill_workers)
        self.devices = worker_devices(config.device, config.placement,   # fails here, clearly
                                      [config.degree(role) for role in self.roles])
        self.heads = head_counts(cfg, config.model or str(self.path))
        self.scheduler: Scheduler | None = None
        self.pool: WorkerPool | None = None
        self.model_info: ModelInfo | None = None
        self._arrivals = itertools.count()
        self.draining = False
        self.dead: str | None = None
        self.stop_ids: tuple[int, ...] = ()
        self.grammars: Grammars | None = None
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        # One thread: big prompts queue behind each other, never behind the loop (the Rust
        # tokenizer releases the GIL; a chat template yields it every switch interval).
        self.tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dllm-tokenize")
        self.watchdog = Watchdog(len(self.roles), config.worker_stall_timeout_s)
        self._watch_task: asyncio.Task | None = None
        self._death_reasons: dict[int, str] = {}
        self.regroups: ServerRegroups | None = None
        self._ready = asyncio.Event()          # a later restart leaves it set
        self._started = False                  # start() has read the model's info: the workers' readiness alone
                                               # let a request in before it, and /health failed on model_info None
        self._failed = asyncio.Event()
        self._tick_due = False

    async def start(self, timeout_s: float = 300.0) -> None:
        loop = asyncio.get_running_loop()
        self.scheduler = Scheduler(self.config, self.roles, self.tokenizer, self._send, self.policy, load=self.load,
                                   batch_arrivals=True)
        self.pool = WorkerPool(self.config, str(self.path), self.roles, self.devices,
                               loop, self._on_messages, self._on_death, self.hooks)
        self.regroups = ServerRegroups(self.config, self.scheduler, self.pool, self.watchdog, self.roles,
                                       self.devices, self.heads,
                                       Layout.of_degrees([len(d) for d in self.devices]))
        self.pool.start_all()
        ready = asyncio.ensure_future(self._ready.wait())
        failed = asyncio.ensure_future(self._failed.wait())
        await asyncio.wait({ready, failed}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel(), failed.cancel()
        if not self._ready.is_set():
            self.pool.stop(timeout_s=5)
            raise RuntimeError(self.scheduler.failure or f"workers not ready after {timeout_s:.0f} s")
        self.model_info = self.scheduler.workers.model
        self.stop_ids = stop_token_ids(self.generation_config, self.model_info.eos_id, self.tokenizer)
        self.grammars = Grammars(str(self.path), self.stop_ids, self.model_info.vocab_size,
                                 timeout_s=self.config.structured_compile_timeout_s)
        if self.watchdog.timeout_s:
            self._watch_task = asyncio.ensure_future(self._watch())
        if self.config.reconfigure:
            self.regroups.start_planner(lambda: not (self.draining or self.dead))
        self._started = True
        log.info("engine ready: %d worker(s), placement %s", len(self.roles), self.config.placement)

    async def drain(self, timeout_s: float) -> int:
        """Let in-flight requests finish for up to `timeout_s`, then abort the rest; returns how many."""
        deadline = time.monotonic() + timeout_s
        while self.scheduler and len(self.scheduler.requests) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.scheduler is None:
            return 0
        left = [e.state.request_id for e in self.scheduler.requests]
        if left:
            log.info("aborting %d in-flight request(s)", len(left))
        for rid in left:
            self.scheduler.abort(rid)
        return len(left)

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop taking requests, drain, then stop and join every worker."""
        self.draining = True
        await self.drain(self.config.shutdown_timeout_s if timeout_s is None else timeout_s)
        if self._watch_task is not None:
            self._watch_task.cancel()
        if self.regroups is not None:
            self.regroups.stop_planner()
        self.tokenize_pool.shutdown(wait=False, cancel_futures=True)
        if self.pool:
            await asyncio.get_running_loop().run_in_executor(None, self.pool.stop)

    @property
    def is_started(self) -> bool:
        return self.scheduler is not None

    @property
    def is_ready(self) -> bool:
        return self._started and self._ready.is_set() and not self.dead

    @property
    def is_healthy(self) -> bool:
        return self.is_ready and self.scheduler.workers.is_healthy and not self.draining

    @property
    def num_requests(self) -> int:
        return len(self.scheduler.requests) if self.scheduler else 0

    def stats(self) -> EngineStats:
        pids = {wid: self.pool.pids(wid) for wid in range(len(self.roles))} if self.pool else {}
        return snapshot(self.scheduler, pids)

    def iteration_trace(self) -> list[tuple[float, LoadReport]]:
        """Recent worker iterations (bounded), with their arrival times."""
        return list(self.scheduler.trace)

    async def reconfigure(self, degrees: list[int], timeout_s: float = 120.0) -> dict:
        """Regroup the devices into instances of these TP degrees while serving; no request is lost or changed."""
        return await self.regroups.reconfigure(degrees, timeout_s)

    def set_policy(self, worker_id: int | None = None, **changes) -> None:
        self.scheduler.set_policy(worker_id, **changes)

    def _send(self, wid: int, msg) -> None:
        self.watchdog.on_sent(wid, time.monotonic())
        self.pool.send(wid, msg)

    def _on_messages(self, wid: int, batch: list) -> None:
        self.watchdog.on_batch(wid, batch, time.monotonic())
        sched = self.scheduler
        sched.on_messages(wid, batch)
        if not self._ready.is_set():
            if sched.is_ready:
                self._ready.set()
            elif sched.failure:
                self._failed.set()
        self._tick_soon()

    def _tick_soon(self) -> None:
        """One scheduler tick at the end of this loop turn, however many arrivals and batches it brought."""
        if not self._tick_due and self.scheduler.has_tick_work:
            self._tick_due = True
            asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self._tick_due = False
        self.scheduler.tick()

    async def _watch(self) -> None:
        """Kill a worker that owes a report for longer than worker_stall_timeout_s; then it is any death."""
        period = min(1.0, self.watchdog.timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            for wid in self.watchdog.stuck(time.monotonic()):
                reason = (f"worker {wid} hung: no progress for {self.watchdog.timeout_s:g} s with work in flight "
                          "(killed by the watchdog)")
                log.error(reason)
                self._death_reasons[wid] = reason
                self.scheduler.counters.worker_hangs += 1
                self.watchdog.reset(wid)
                self.pool.kill(wid)

    def _on_death(self, wid: int, exitcode) -> None:
        reason = self._death_reasons.pop(wid, None) or f"worker {wid} died (exit code {exitcode})"
        log.error(reason)
        if not self._ready.is_set():
            self.scheduler.failure = self.scheduler.failure or reason
            self._failed.set()
            return
        if self.config.restart_workers and not self.draining:
            ids = self.pool.restart_ids(wid)
            self.pool.detach(ids)
            for i in ids:
                self.watchdog.reset(i)
            self.scheduler.on_worker_lost(ids, reason)      # resumed elsewhere now, or on the restarted one
            # off the loop: joining the old processes and placing new ones takes seconds (under Ray, after a node
            # loss, 13 s), and the live workers' streams must keep flowing meanwhile
            restart = self.pool.in_spawner(self.pool.restart, wid)
            restart.add_done_callback(functools.partial(self._restarted, wid, exitcode))
        else:
            self.dead = reason
            self.scheduler.on_worker_lost(list(range(len(self.roles))), reason, resume=False)

    def _restarted(self, wid: int, exitcode, restart: asyncio.Future) -> None:
        if restart.cancelled():
            return
        exc = restart.exception()
        if exc is not None:          # e.g. Ray placed it on a node that died unnoticed: its bundle moves later
            log.error("worker %d: restart failed (%s: %s); again in %g s", wid, type(exc).__name__, exc,
                      RESTART_RETRY_S)
            self.watchdog.reset(wid)
            asyncio.get_running_loop().call_later(RESTART_RETRY_S, self._retry_restart, wid, exitcode)
            return
        ids = restart.result()            # [] when the pool stopped meanwhile
        for i in ids:
            self.watchdog.reset(i)
        if ids:
            self.scheduler.counters.worker_restarts += 1

    def _retry_restart(self, wid: int, exitcode) -> None:
        if not self.draining and self.dead is None and self.pool is not None and not self.pool.stopping:
            self._death_reasons[wid] = f"worker {wid}: trying its restart again"
            self._on_death(wid, exitcode)

    def prepare(self, prompt: Any = None, params: SamplingParams | None = None, messages: list[dict] | None = None,
                request_id: str | None = None) -> RequestState:
        """Validate and build the request state (ValueError names the field); tokenizes on this thread."""
        self._check_chars(prompt, messages)
        return self._build(*self._tokenize(prompt, messages), params, request_id)

    async def prepare_async(self, prompt: Any = None, params: SamplingParams | None = None,
                            messages: list[dict] | None = None, request_id: str | None = None) -> RequestState:
        """prepare(), with a long input tokenized off the event loop."""
        chars = self._check_chars(prompt, messages)
        if chars < OFFLOAD_CHARS:
            text, ids = self._tokenize(prompt, messages)
        else:
            loop = asyncio.get_running_loop()
            text, ids = await loop.run_in_executor(self.tokenize_pool, self._tokenize, prompt, messages)
        spec = params.structured_outputs if params is not None else None
        if spec is not None and self.grammars is not None and not self.grammars.is_checked(spec):
            # compiled off the loop (in a child process with a time limit): a new schema never stalls the front
            await asyncio.get_running_loop().run_in_executor(None, self.grammars.check, spec, params.max_tokens)
        return self._build(text, ids, params, request_id)

    def _check_chars(self, prompt: Any, messages: list[dict] | None) -> int:
        chars = input_chars(prompt, messages)
        if self.tokenizer is not None and self.model_info is not None:
            check_prompt_chars(chars, self.model_info.max_len, self.tokenizer.max_token_chars,
                               "messages" if messages is not None else "prompt")
        return chars

    def _tokenize(self, prompt: Any, messages: list[dict] | None) -> tuple[str | None, list[int]]:
        if messages is not None:
            if self.tokenizer is None:
                raise ValueError("messages: chat needs a tokenizer (skip_tokenizer_init is set)")
            return None, self.tokenizer.apply_chat_template(messages)
        return prompt_ids(prompt, self.tokenizer)

    def _build(self, text: str | None, ids: list[int], params: SamplingParams | None,
               request_id: str | None) -> RequestState:
        params = params or SamplingParams(**self.sampling_defaults)
        seq = next(self._arrivals)
        resolved = params.resolve(self.config.block_length, request_seed(self.config.seed, seq), self.model_info.block_size)
        check_request(ids, params, resolved, self.model_info)
        resolved = self.grammars.constrain(params, resolved)
        state = RequestState(request_id or f"req-{uuid.uuid4().hex[:16]}", text, ids, params, resolved,
                             self.model_info.mask_id, self.stop_ids, seq,
                             self.tokenizer.decode if self.tokenizer else None)
        workers = self.scheduler.workers
        pages = workers.pages_for(state.prompt_len + state.answer_len)
        if pages > workers.min_capacity_pages():
            raise ValueError(f"max_tokens: a canvas of {state.prompt_len + state.answer_len} tokens needs {pages} "
                             f"KV pages; a worker holds {workers.min_capacity_pages()}")
        return state

    def submit(self, state: RequestState, stream: str = STREAM_NONE) -> RequestHandle:
        """Admit a prepared request synchronously, so a refusal comes before any response."""
        if self.dead:
            raise EngineDead(self.dead)
        if self.draining:
            raise EngineOverloaded("server is shutting down")
        if not self.is_ready:
            raise EngineOverloaded("engine is starting")
        if self.queue_full:
            raise EngineOverloaded(f"the request queue is full ({self.config.max_waiting_requests} waiting)")
        rid = state.request_id
        events = StreamBuffer(self.config.stream_buffer_events, lambda: self._overflowed(rid))
        entry = Entry(state, events, stream, time.monotonic())
        self.scheduler.add(entry)
        self._tick_soon()
        return RequestHandle(entry, self.abort)

    def abort(self, request_id: str) -> None:
        if self.scheduler is not None:
            self.scheduler.abort(request_id)

    @property
    def queue_full(self) -> bool:
        return self.scheduler is not None and self.scheduler.requests.num_waiting >= self.config.max_waiting_requests

    def _overflowed(self, request_id: str) -> None:
        """A client that does not read its stream: end the request."""
        if self.scheduler is not None and self.scheduler.requests.get(request_id) is not None:
            self.scheduler.counters.streams_overflowed += 1
            self.scheduler.abort(request_id, "error", f"the client is not reading its stream "
                                 f"({self.config.stream_buffer_events} events buffered)")

    async def generate(self, request: RequestState | RequestHandle,
                       stream: str = STREAM_NONE) -> AsyncIterator[StreamEvent]:
        handle = request if isinstance(request, RequestHandle) else self.submit(request, stream)
        events = handle._entry.events
        finished = False
        try:
            while True:
                event = await events.get()
                if event.output is not None:
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished:   # the consumer went away: free the worker's KV within an iteration
                self.abort(handle.request_id)

    async def run(self, prompt: Any = None, params: SamplingParams | None = None, **kw) -> GenerationOutput:
        return await self.run_state(await self.prepare_async(prompt, params, **kw))

    async def run_state(self, state: RequestState) -> GenerationOutput:
        async for event in self.generate(state):
            if event.output is not None:
                return event.output
