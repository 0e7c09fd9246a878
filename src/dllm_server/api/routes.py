"""HTTP handlers: chat and text completions (JSON or SSE), models, health, metrics, version,
tokenize / detokenize. Validation and tokenisation happen before any response is started."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any

from pydantic import BaseModel, RootModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import __version__
from ..decoding.params import sample_seed
from ..engine.async_engine import AsyncEngine, EngineDead, EngineOverloaded
from ..request.events import STREAM_NONE, STREAM_PROGRESS, STREAM_TEXT
from ..engine.handle import RequestHandle
from . import choice_fields
from . import sse
from .body import Limits, check_limits, parse_body, read_body
from .errors import APIError, from_value_error
from .metrics import Metrics
from .protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, DiffusionFields,
                       TokenizeMessages, TokenizeRequest)
from .stream_guard import GuardedStreamingResponse

log = logging.getLogger(__name__)


def check_serving(engine: AsyncEngine, draining_ok: bool = False) -> None:
    """500 once the engine is dead, 503 while it starts or (unless `draining_ok`) drains."""
    if engine.dead:
        raise APIError(500, f"engine is dead: {engine.dead}")
    if engine.draining and not draining_ok:
        raise APIError(503, "server is shutting down", headers={"Retry-After": "5"})
    if not engine.is_ready:
        raise APIError(503, "engine is starting", headers={"Retry-After": "2"})


class Routes:
    def __init__(self, engine: AsyncEngine, model_name: str, metrics: Metrics):
        self.engine = engine
        self.model_name = model_name
        self.metrics = metrics
        self.limits = Limits.from_config(engine.config)
        self._probe: asyncio.Future | None = None

    # ---- helpers ----
    async def _parse(self, request: Request, model: type[BaseModel]):
        req = parse_body(await read_body(request, self.limits), model)
        check_limits(req.root if isinstance(req, RootModel) else req, self.limits)
        ignored = req.ignored_fields()
        if ignored:
            log.info("ignoring unknown request fields: %s", ", ".join(ignored))
        if req.model not in (None, self.model_name):
            raise APIError(404, f"The model `{req.model}` does not exist.", "model")
        return req

    def _check_serving(self) -> None:
        check_serving(self.engine)

    def _check_admission(self) -> None:
        """Before the body is parsed or tokenized: under overload a refusal must cost next to
        nothing, or the refusals themselves keep the front too busy to accept connections."""
        self._check_serving()
        if self.engine.queue_full:
            raise APIError(503, f"the request queue is full ({self.engine.config.max_waiting_requests} waiting)",
                           headers={"Retry-After": "2"})

    async def _submit(self, prompts: list[Any], req: DiffusionFields, default_max: int, request_id: str,
                      chat: bool) -> list[RequestHandle]:
        """One engine request per (prompt, sample): choice k = prompt k // n, sample k % n, whose
        seed is sample_seed(the first sample's seed, k % n)."""
        self._check_serving()
        many = len(prompts) * req.n > 1
        try:
            params = req.sampling_params(default_max, self.engine.sampling_defaults)
            states = []
            for i, p in enumerate(prompts):
                first = None
                for j in range(req.n):
                    rid = f"{request_id}-{i * req.n + j}" if many else request_id
                    pj = params if first is None else dataclasses.replace(
                        params, seed=sample_seed(first.params.seed, j))
                    if chat:
                        st = await self.engine.prepare_async(params=pj, messages=p, request_id=rid)
                    else:
                        st = await self.engine.prepare_async(p, pj, request_id=rid)
                    if first is None:
                        first = st
                    states.append(st)
        except ValueError as exc:
            raise from_value_error(exc)
        stream = STREAM_PROGRESS if req.include_progress else STREAM_TEXT if req.stream else STREAM_NONE
        handles = []
        try:
            for st in states:
                handles.append(self.engine.submit(st, stream))
        except EngineOverloaded as exc:
            for h in handles:
                h.abort()
            raise APIError(503, str(exc), headers={"Retry-After": "2"})
        except EngineDead as exc:
            raise APIError(500, f"engine is dead: {exc}")
        return handles

    def _observe(self, handle: RequestHandle, output, req: DiffusionFields) -> None:
        slo_ms = req.slo_ms if req.slo_ms is not None else self.engine.config.default_slo_ms
        self.metrics.observe_finished(output, handle.arrived_at, handle.first_step_at, handle.first_token_at,
                                      time.monotonic(), slo_ms)

    # ---- generation endpoints ----
    async def chat_completions(self, request: Request) -> Response:
        self._check_admission()
        req = await self._parse(request, ChatCompletionRequest)
        messages = [m.as_template_message() for m in req.messages]
        rid = "chatcmpl-" + request.state.request_id
        entries = await self._submit([messages], req, self.engine.config.default_chat_max_tokens, rid, chat=True)
        return await self._respond(request, req, entries, rid, chat=True)

    async def completions(self, request: Request) -> Response:
        self._check_admission()
        req = await self._parse(request, CompletionRequest)
        rid = "cmpl-" + request.state.request_id
        entries = await self._submit(req.prompts(), req, self.engine.config.default_completion_max_tokens, rid,
                                     chat=False)
        return await self._respond(request, req, entries, rid, chat=False)

    async def _respond(self, request: Request, req: DiffusionFields, entries: list[RequestHandle], rid: str,
                       chat: bool) -> Response:
        created = int(time.time())
        if req.stream:
            body = sse.with_keep_alive(self._stream(req, entries, rid, created, chat),
                                       self.engine.config.keep_alive_s)

            def stalled() -> None:          # the client stopped reading: free its KV now
                self.metrics.streams_stalled.labels(self.model_name).inc()
                for e in entries:
                    e.abort()
            return GuardedStreamingResponse(body, self.engine.config.stream_stall_timeout_s, stalled,
                                            media_type="text/event-stream",
                                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        outputs = await _until_disconnect(request, self._collect(entries, req))
        if outputs is None:            # the client went away: its requests are aborted
            return Response(status_code=499)
        for o in outputs:
            if o.finish_reason == "error":
                raise APIError(500, f"generation failed: {o.error}")
        choices = []
        for i, o in enumerate(outputs):
            c = {"index": i, "logprobs": choice_fields.logprobs(o.token_ids, o.logprobs, chat, self.engine.tokenizer),
                 "finish_reason": o.finish_reason, "stop_reason": None}
            if chat:
                c["message"] = {"role": "assistant", "content": o.text}
            else:
                c["text"] = o.text
            if req.return_token_ids:
                c["token_ids"] = o.token_ids
                c["prompt_token_ids"] = o.prompt_token_ids
            c["dllm"] = choice_fields.dllm_summary(o, req, entries[i], self.engine.config.default_slo_ms)
            choices.append(c)
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": self.model_name, "choices": choices,
                             "usage": choice_fields.usage(outputs, req.n)})

    async def _collect(self, entries: list[RequestHandle], req: DiffusionFields):
        async def one(entry):
            async for ev in self.engine.generate(entry):
                if ev.output is not None:
                    self._observe(entry, ev.output, req)
                    return ev.output
        return await asyncio.gather(*[one(e) for e in entries])

    async def _stream(self, req: DiffusionFields, entries: list[RequestHandle], rid: str, created: int, chat: bool):
        obj = "chat.completion.chunk" if chat else "text_completion"
        hold = max((len(s) for s in ([req.stop] if isinstance(req.stop, str) else req.stop or ())), default=1) - 1
        sent = [0] * len(entries)           # characters streamed: the stable text only grows
        role_sent = [False] * len(entries)
        outputs = [None] * len(entries)
        pending: list[list] = [[] for _ in entries]     # (token, logprob entry) not yet sent with a chunk
        tokens_sent = [0] * len(entries)

        def chunk(i: int, text: str, finish: str | None) -> dict:
            logprobs = None
            if pending[i] or (finish is not None and outputs[i] is not None and outputs[i].logprobs is not None):
                ids, lps = zip(*pending[i]) if pending[i] else ((), ())
                logprobs = choice_fields.logprobs(list(ids), list(lps), chat, self.engine.tokenizer, sent[i])
                tokens_sent[i] += len(pending[i])
                pending[i] = []
            if chat:
                delta = {"content": text}
                if not role_sent[i]:
                    delta = {"role": "assistant", "content": text}
                    role_sent[i] = True
                choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            else:
                choice = {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}
            return {"id": rid, "object": obj, "created": created, "model": self.model_name, "choices": [choice]}

        try:
            async for i, ev in _merge([self.engine.generate(e) for e in entries]):
                if ev.output is not None:
                    out = outputs[i] = ev.output
                    self._observe(entries[i], out, req)
                    if out.finish_reason == "error":
                        yield sse.frame({"error": {"message": f"generation failed: {out.error}",
                                                   "type": "InternalServerError", "param": None, "code": 500}})
                        continue
                    rest = out.text[sent[i]:] if len(out.text) > sent[i] else ""
                    if out.logprobs is not None:     # the answer's tokens no chunk carried yet
                        pending[i] = list(zip(out.token_ids, out.logprobs))[tokens_sent[i]:]
                    final = chunk(i, rest, out.finish_reason)
                    final["choices"][0]["dllm"] = choice_fields.dllm_summary(out, req, entries[i],
                                                                             self.engine.config.default_slo_ms)
                    yield sse.frame(final)
                    continue
                if req.include_progress:
                    d, e = ev.delta, entries[i]
                    progress = {"index": i, "block": d.block_index, "step": d.step,
                                "positions": [p - e.prompt_len for p in d.positions],
                                "token_ids": list(d.token_ids), "tokens": ev.tokens,
                                "num_committed": len(d.positions) - len(ev.edits or ()),
                                "masked": d.num_masked, "canvas": ev.canvas, "block_length": e.block_length,
                                "block_offset": e.block_offset, "answer_len": e.answer_len}
                    if ev.edits is not None:          # token editing: positions rewritten, from -> to token id
                        progress["edits"] = [list(x) for x in ev.edits]
                    yield sse.frame({"id": rid, "object": obj, "created": created, "model": self.model_name,
                                     "choices": [], "dllm": progress})
                if ev.logprobs:
                    pending[i] += ev.logprobs
                stable = len(ev.text or "") - max(0, hold)     # a stop string may still cut the rest
                if stable > sent[i]:
                    yield sse.frame(chunk(i, ev.text[sent[i]:stable], None))
                    sent[i] = stable
            if req.include_usage and all(o is not None for o in outputs):
                yield sse.frame({"id": rid, "object": obj, "created": created, "model": self.model_name,
                                 "choices": [], "usage": choice_fields.usage(outputs, req.n)})
        except Exception as exc:   # after the 200: report in-band, never hang
            log.exception("stream failed")
            yield sse.frame({"error": {"message": str(exc), "type": "InternalServerError", "param": None,
                                       "code": 500}})
        yield sse.DONE

    # ---- other endpoints ----
    async def models(self, request: Request) -> Response:
        args = self.engine.model_info if self.engine.is_ready else None
        card = {"id": self.model_name, "object": "model", "created": int(self.engine.started_wall),
                "owned_by": "dllm-server", "root": str(self.engine.path), "parent": None,
                "max_model_len": args.max_len if args else None, "permission": []}
        return JSONResponse({"object": "list", "data": [card]})

    async def version(self, request: Request) -> Response:
        """The version, and each worker's batch-invariance self-check (docs/decoding.md)."""
        checks, instances = {}, []
        if self.engine.is_started:
            for w in self.engine.stats().workers:
                instances.append({"worker": w.worker_id, "role": w.role, "tensor_parallel_size": w.tp_size,
                                  "kv_pages": w.num_pages, "rank_pids": list(w.rank_pids),
                                  "rank_rss_mb": [round(r, 1) for r in w.rank_rss_mb],
                                  "rank_weights_mb": [round(r, 1) for r in w.rank_weights_mb]})
                r = w.row_invariance
                if r is not None:
                    checks[str(w.worker_id)] = {"holds": r.holds, "fixed_matmul_rows": r.fixed_rows,
                                                "row_counts_checked": len(r.row_counts),
                                                "max_rows_checked": max(r.row_counts, default=0),
                                                "projection_shapes": [list(s) for s in r.shapes],
                                                "num_failures": r.num_failures, "failures": list(r.failures),
                                                "seconds": r.seconds}
        return JSONResponse({"version": __version__, "instances": instances, "batch_invariance": checks})

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def health(self, request: Request) -> Response:
        if not self.engine.is_healthy:
            return Response(status_code=503, headers={"Retry-After": "2"})
        if self.engine.num_requests:        # busy: outputs are flowing, no probe needed
            return Response(status_code=200)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._run_probe())
        ok = await asyncio.shield(self._probe)
        return Response(status_code=200 if ok else 503)

    async def _run_probe(self) -> bool:
        """A real one-step request through a worker (a wedged worker fails it)."""
        from ..decoding.params import SamplingParams
        info = self.engine.model_info
        token = 1 if info.mask_id != 1 else 2
        block = None if info.block_size else 1         # a block-causal model decodes in its own blocks only
        try:
            state = self.engine.prepare({"prompt_token_ids": [token]}, SamplingParams(max_tokens=1, block_length=block),
                                        request_id=f"health-{uuid.uuid4().hex[:8]}")
            out = await asyncio.wait_for(self.engine.run_state(state), timeout=20)
            return out.finish_reason in ("stop", "length")
        except Exception:
            log.exception("health probe failed")
            return False

    async def tokenize(self, request: Request) -> Response:
        req = await self._parse(request, TokenizeRequest)
        tok = self._tokenizer()

        def run() -> list[int]:
            if isinstance(req.root, TokenizeMessages):
                return tok.apply_chat_template([m.as_template_message() for m in req.root.messages])
            return tok.encode(req.root.prompt, req.root.add_special_tokens)
        try:
            ids = await asyncio.get_running_loop().run_in_executor(self.engine.tokenize_pool, run)
        except ValueError as exc:
            raise from_value_error(exc)
        max_len = self.engine.model_info.max_len if self.engine.is_ready else None
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": max_len})

    async def detokenize(self, request: Request) -> Response:
        req = await self._parse(request, DetokenizeRequest)
        tok = self._tokenizer()
        bad = [t for t in req.tokens if not 0 <= t < tok.vocab_size]
        if bad:
            raise APIError(400, f"tokens: ids {bad[:5]} are outside the vocabulary [0, {tok.vocab_size})", "tokens")
        return JSONResponse({"prompt": tok.hf.decode(req.tokens)})

    async def tokenizer_info(self, request: Request) -> Response:
        info = self._tokenizer().info()
        info["model_max_length"] = self.engine.model_info.max_len if self.engine.is_ready else None
        return JSONResponse(info)

    def _tokenizer(self):
        if self.engine.tokenizer is None:
            raise APIError(400, "model: this server was started without a tokenizer")
        return self.engine.tokenizer


async def _merge(gens):
    """Interleave several async iterators, yielding (index, item)."""
    if len(gens) == 1:
        async for item in gens[0]:
            yield 0, item
        return
    # Bounded: a pump that gets ahead waits, so a slow client's events stay in the requests' own
    # (bounded) buffers instead of piling up here.
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * len(gens))
    done = object()

    async def pump(i, g):
        try:
            async for item in g:
                await queue.put((i, item))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    remaining = len(gens)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def _until_disconnect(request: Request, coro):
    """Run `coro` unless the client disconnects first (then cancel it, which aborts its requests)."""
    work = asyncio.ensure_future(coro)

    async def disconnected():
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watch = asyncio.ensure_future(disconnected())
    done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        watch.cancel()
        return work.result()
    work.cancel()
    try:
        await work
    except asyncio.CancelledError:
        pass
    return None
