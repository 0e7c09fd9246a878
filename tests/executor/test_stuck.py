"""A worker that hangs in a forward and a consumer that stops reading: the engine ends what they
hold with a clear error, never hangs, and frees the KV."""
import asyncio
import time

import pytest

from dllm_server import SamplingParams
from dllm_server.config import TestHooks
from dllm_server.engine.async_engine import EngineDead
from dllm_server.request.events import STREAM_PROGRESS

from tests.live import running


@pytest.mark.parametrize("restart", [True, False])
async def test_a_hung_worker_fails_its_requests_within_the_watchdog_timeout(engine_config, restart):
    config = engine_config.replace(worker_stall_timeout_s=1.0, restart_workers=restart)
    async with running(config, hooks=TestHooks(hang_at_forward=6)) as engine:
        params = SamplingParams(max_tokens=40, steps=40, ignore_eos=True)
        outs = await asyncio.wait_for(asyncio.gather(*[engine.run({"prompt_token_ids": [i + 1, 2]}, params)
                                                       for i in range(3)]), 30)
        # the 30 s bound is "never hangs", not a timing. With a restart the requests resume there; without one
        # nothing will serve them and they fail, the watchdog's decision in the error
        assert engine.stats().counters.worker_hangs == 1
        if restart:
            assert all(o.finish_reason == "length" for o in outs) and engine.stats().counters.requests_resumed == 3
        else:
            assert all(o.finish_reason == "error" and "worker 0 hung: no progress for 1 s" in o.error for o in outs)
        if not restart:
            assert engine.dead and not engine.is_healthy
            with pytest.raises(EngineDead):
                await engine.run({"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=4))
            return
        deadline = time.monotonic() + 60
        while not engine.is_healthy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        out = await engine.run({"prompt_token_ids": [3, 4]}, SamplingParams(max_tokens=4))
        assert out.finish_reason in ("stop", "length")


async def test_a_slow_worker_is_not_mistaken_for_a_hung_one(engine_config):
    """Long requests with a short timeout: every iteration reports, so the watchdog stays quiet."""
    async with running(engine_config.replace(worker_stall_timeout_s=0.5)) as engine:
        params = SamplingParams(max_tokens=200, steps=200, ignore_eos=True)
        outs = await asyncio.gather(*[engine.run({"prompt_token_ids": [i + 1, 2]}, params) for i in range(8)])
        await asyncio.sleep(1.0)        # idle: nothing is owed
        assert all(o.finish_reason == "length" for o in outs)
        assert engine.stats().counters.worker_hangs == 0


async def test_a_consumer_that_stops_reading_ends_its_request(engine_config):
    async with running(engine_config.replace(stream_buffer_events=8)) as engine:
        state = engine.prepare({"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=64, steps=64, ignore_eos=True))
        handle = engine.submit(state, STREAM_PROGRESS)
        deadline = time.monotonic() + 30
        while not handle.finished and time.monotonic() < deadline:
            await asyncio.sleep(0.02)          # nobody reads the events
        assert handle.finished and engine.stats().counters.streams_overflowed == 1
        events = [e async for e in engine.generate(handle)]
        assert len(events) == 9 and events[-1].output.finish_reason == "error"
        assert "not reading" in events[-1].output.error
        deadline = time.monotonic() + 10
        while engine.stats().workers[0].free_pages != engine.stats().workers[0].num_pages:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
