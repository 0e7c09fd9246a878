"""Tensor-parallel instances served by real worker processes (a leader and a follower over gloo):
token-identical to the offline API in float64 in every cache mode, both architectures; a killed
follower ends its instance's requests within 5 s and the instance comes back; an invalid degree
is refused before any process starts."""
import asyncio
import os
import signal
import time

import pytest

from dllm_server import LLM, SamplingParams
from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine

from .conftest import running
from .test_placements import mixed_requests


@pytest.mark.parametrize("cache", ["dual", "prefix", "none"])
@pytest.mark.parametrize("arch", ["llada", "dream"])
async def test_tp2_instance_matches_offline_tp1_in_float64(request, arch, cache):
    path = request.getfixturevalue(f"tiny_{arch}")
    reqs = mixed_requests(16)
    offline = LLM(path, block_length=8, dtype="float64", cache=cache).generate([p for p, _ in reqs],
                                                                                [s for _, s in reqs])
    config = ServerConfig(model=path, block_length=8, dtype="float64", cache=cache, threads_per_worker=1,
                          tensor_parallel_size=2)
    async with running(config) as engine:
        outs = await asyncio.gather(*[engine.run(p, s) for p, s in reqs])
        w = engine.stats().workers
        assert len(w) == 1 and w[0].tp_size == 2 and len(w[0].rank_pids) == 2 and len(w[0].rank_rss_mb) == 2
    assert [o.token_ids for o in outs] == [o.token_ids for o in offline]
    assert all(o.finish_reason in ("stop", "length") for o in outs)


async def test_a_killed_follower_ends_its_instance_then_it_comes_back(tiny_llada):
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float32", threads_per_worker=1,
                          tensor_parallel_size=2)
    async with running(config) as engine:
        params = SamplingParams(max_tokens=200, ignore_eos=True, steps=200)   # slow: one token per forward
        tasks = [asyncio.ensure_future(engine.run({"prompt_token_ids": [i + 1, 3]}, params)) for i in range(20)]
        ended_at = {}
        for i, t in enumerate(tasks):
            t.add_done_callback(lambda _, i=i: ended_at.setdefault(i, time.monotonic()))
        await asyncio.sleep(1.0)
        leader, follower = engine.stats().workers[0].rank_pids
        os.kill(follower, signal.SIGKILL)
        killed_at = time.monotonic()
        await asyncio.wait(tasks, timeout=120)
        outs = [t.result() for t in tasks]
        errors = [i for i, o in enumerate(outs) if o.finish_reason == "error"]
        assert errors and all("worker 0 died" in outs[i].error for i in errors)
        assert max(ended_at[i] for i in errors) - killed_at < 5.0
        deadline = time.monotonic() + 60
        while not engine.is_healthy and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        pids = engine.stats().workers[0].rank_pids
        assert engine.is_healthy and leader not in pids and follower not in pids
        with pytest.raises(ProcessLookupError):        # the leader went with its follower
            os.kill(leader, 0)
        more = await asyncio.gather(*[engine.run({"prompt_token_ids": [5, i + 1]}, SamplingParams(max_tokens=16))
                                      for i in range(8)])
        assert all(o.finish_reason in ("stop", "length") for o in more)


def test_an_invalid_degree_is_refused_before_any_worker_starts(tiny_llada):
    with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide the model's 4 attention heads"):
        AsyncEngine(ServerConfig(model=tiny_llada, tensor_parallel_size=3))
    with pytest.raises(ValueError, match="offline LLM runs one process"):
        LLM(tiny_llada, tensor_parallel_size=2)
