"""Aborts, injected errors, oversized requests and a killed worker: nothing hangs, nothing leaks."""
import asyncio
import os
import random
import signal
import time

import pytest

from dllm_server import SamplingParams
from dllm_server.config import TestHooks
from dllm_server.engine.async_engine import EngineDead

from tests.live import kill_resumes, recovers, running, slow_requests


async def _quiesce(engine, timeout_s=20):
    """Wait until every worker's latest report shows a full page pool."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ws = engine.stats().workers
        if all(w.num_iterations > 0 and w.free_pages == w.num_pages for w in ws):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(engine.stats().workers)


@pytest.mark.parametrize("placement,kv_transfer", [("colocated", "layerwise"), ("disaggregated", "layerwise"),
                                                   ("disaggregated", "after_prefill")])
async def test_random_aborts_and_injected_errors_leave_nothing_behind(engine_config, placement, kv_transfer):
    """In disaggregated placement the aborts and failures also land mid-handoff: on blocks whose
    KV is streaming, held, received but not installed, or refused for want of pages (the decode
    workers' pools are small)."""
    config = engine_config.replace(num_workers=2, placement=placement, kv_transfer=kv_transfer)
    if placement == "disaggregated":
        config = config.replace(num_pages=12, page_size=8)
    rng = random.Random(3)
    async with running(config, hooks=TestHooks(fail_every_n_forwards=23)) as engine:
        async def one(i):
            state = engine.prepare({"prompt_token_ids": [i % 200 + 1, 7, 9]},
                                   SamplingParams(max_tokens=rng.choice([8, 24, 40]), ignore_eos=True))
            task = asyncio.ensure_future(_consume(engine, state))
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.2)
                task.cancel()
            try:
                return await task
            except asyncio.CancelledError:
                return "cancelled"

        results = await asyncio.gather(*[one(i) for i in range(200)])
        reasons = {r if isinstance(r, str) else r.finish_reason for r in results}
        assert "error" in reasons and "cancelled" in reasons and "length" in reasons
        await _quiesce(engine)
        stats = engine.stats()
        assert not stats.num_requests and stats.num_waiting == 0
        assert not stats.num_pending and not stats.num_held
        assert all(w.reserved_pages == 0 for w in stats.workers)
        c = stats.counters
        if placement == "disaggregated":
            assert c.kv_transfer_bytes > 0


async def _consume(engine, state):
    async for event in engine.generate(state):
        if event.output is not None:
            return event.output


async def test_request_larger_than_any_pool_is_refused_at_once(engine_config):
    async with running(engine_config.replace(num_pages=6, page_size=16)) as engine:   # 96 tokens
        t = time.monotonic()
        with pytest.raises(ValueError, match="KV pages"):
            engine.prepare({"prompt_token_ids": [1] * 50}, SamplingParams(max_tokens=64))
        assert time.monotonic() - t < 1
        outs = await asyncio.gather(*[engine.run({"prompt_token_ids": [i + 1, 2]}, SamplingParams(max_tokens=40))
                                      for i in range(6)])
        assert all(o.finish_reason in ("stop", "length") for o in outs)


async def test_kill_9_of_a_worker_resumes_its_requests_then_recovers(engine_config):
    async with running(engine_config.replace(num_workers=2)) as engine:
        tasks, ended = slow_requests(engine, 50)
        await asyncio.sleep(1.0)
        victim = engine.stats().workers[0].pid
        await kill_resumes(engine, victim, tasks, 50)
        assert engine.stats().counters.worker_restarts == 1
        await recovers(engine, requests=20)
        assert engine.stats().workers[0].pid != victim


async def test_without_restart_the_engine_is_dead(engine_config):
    async with running(engine_config.replace(restart_workers=False)) as engine:
        os.kill(engine.stats().workers[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not engine.dead and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert engine.dead
        with pytest.raises(EngineDead):
            await engine.run({"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=8))


async def test_kill_9_of_the_decode_worker_mid_handoffs(engine_config):
    """Disaggregated: the decode worker dies while KV streams to it. Nothing hangs (the prefill
    worker's sends go with the restarted process group), then the engine serves again."""
    async with running(engine_config.replace(placement="disaggregated", num_workers=1)) as engine:
        params = SamplingParams(max_tokens=96, ignore_eos=True, steps=96)
        tasks = [asyncio.ensure_future(engine.run({"prompt_token_ids": [i + 1, 3] * 20}, params)) for i in range(30)]
        # Kill as soon as KV streams (a fixed sleep raced the run: on a fast machine all 30 were done).
        deadline = time.monotonic() + 30
        while engine.stats().counters.kv_handoffs < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert engine.stats().counters.kv_handoffs >= 3 and not all(t.done() for t in tasks)
        os.kill(engine.stats().workers[1].pid, signal.SIGKILL)
        done, pending = await asyncio.wait(tasks, timeout=60)
        assert not pending, f"{len(pending)} requests hung"
        outs = [t.result() for t in tasks]
        assert {o.finish_reason for o in outs} == {"length"}             # resumed after the group's restart
        assert engine.stats().counters.requests_resumed >= 1
        deadline = time.monotonic() + 60
        while not engine.is_healthy and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert engine.is_healthy
        more = await asyncio.gather(*[engine.run({"prompt_token_ids": [5, i + 1]}, SamplingParams(max_tokens=40))
                                      for i in range(10)])
        assert all(o.finish_reason in ("stop", "length") for o in more)
        assert engine.stats().counters.kv_handoffs > 0


async def test_a_worker_killed_under_load_loses_nothing_and_streams_never_repeat_text(engine_config):
    """One of 2 workers SIGKILLed with 24 greedy requests in flight, half streaming: every request is answered
    (resumed from its block's start on the other worker or the restarted one), each answer equals the same
    request's without a fault (float64), and every stream's text only ever grows."""
    from dllm_server.request.events import STREAM_TEXT
    config = engine_config.replace(num_workers=2, dtype="float64")
    params = SamplingParams(max_tokens=96, steps=96, ignore_eos=True)
    prompts = [{"prompt_token_ids": [(5 * i + j) % 90 + 3 for j in range(4 + i % 7)]} for i in range(24)]

    async def one(engine, i, stream):
        state = engine.prepare(prompts[i], params)
        texts = []
        async for ev in engine.generate(state, STREAM_TEXT if stream else "none"):
            if ev.output is not None:
                return ev.output, texts
            texts.append(ev.text)

    async with running(config) as engine:
        tasks = [asyncio.ensure_future(one(engine, i, i % 2 == 0)) for i in range(24)]
        while engine.stats().num_running < 8:
            await asyncio.sleep(0.02)
        os.kill(engine.stats().workers[0].pid, signal.SIGKILL)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 180)
        assert engine.stats().counters.requests_resumed >= 1
        await recovers(engine, requests=2)
        clean = await asyncio.gather(*[engine.run(p, params) for p in prompts])
    assert all(out.finish_reason == "length" for out, _ in results), [out.error for out, _ in results]
    assert [out.token_ids for out, _ in results] == [o.token_ids for o in clean]
    for (out, texts), i in zip(results, range(24)):
        if i % 2 == 0:
            assert all(b.startswith(a) and b != a for a, b in zip(texts, texts[1:])), texts
            assert not texts or out.text.startswith(texts[-1])
