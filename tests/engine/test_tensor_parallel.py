"""Tensor-parallel instances served by real worker processes (a leader and a follower over gloo):
token-identical to the offline API in float64 in every cache mode, both architectures; a killed
or a stopped (hung) follower brings its instance down, its requests resume and the instance comes back;
an invalid degree is refused before any process starts."""
import asyncio
import os

import pytest

from dllm_server import LLM
from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine

from tests.live import kill_resumes, recovers, running, slow_requests, stop_is_found
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


async def test_a_killed_follower_ends_its_instance_its_requests_resume_and_it_comes_back(tiny_llada):
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float32", threads_per_worker=1,
                          tensor_parallel_size=2)
    async with running(config) as engine:
        tasks, ended = slow_requests(engine, 20)
        await asyncio.sleep(1.0)
        leader, follower = engine.stats().workers[0].rank_pids
        await kill_resumes(engine, follower, tasks, 20)
        await recovers(engine)
        pids = engine.stats().workers[0].rank_pids
        assert leader not in pids and follower not in pids
        with pytest.raises(ProcessLookupError):        # the leader went with its follower
            os.kill(leader, 0)


async def test_a_stopped_follower_is_found_by_the_watchdog_its_requests_resume_and_it_comes_back(tiny_llada):
    """SIGSTOP of a rank (a hang, not a death): the leader waits in a collective, so the instance owes the
    front a report; the watchdog kills it within its timeout, the requests resume on the restarted instance
    (answers equal a fault-free run's) and nothing is left behind (the stopped rank goes with its group)."""
    config = ServerConfig(model=tiny_llada, block_length=8, dtype="float32", threads_per_worker=1,
                          tensor_parallel_size=2, worker_stall_timeout_s=2.0)
    async with running(config) as engine:
        tasks, _ = slow_requests(engine, 8)
        await asyncio.sleep(1.0)
        leader, follower = engine.stats().workers[0].rank_pids
        await stop_is_found(engine, follower, 2.0)
        outs = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert all(o.finish_reason == "length" for o in outs) and engine.stats().counters.requests_resumed >= 1
        await recovers(engine, requests=2)
        again, _ = slow_requests(engine, 8)
        assert [o.token_ids for o in await asyncio.gather(*again)] == [o.token_ids for o in outs]
        pids = engine.stats().workers[0].rank_pids
        assert leader not in pids and follower not in pids
    with pytest.raises(ProcessLookupError):
        os.kill(follower, 0)


def test_an_invalid_degree_is_refused_before_any_worker_starts(tiny_llada):
    with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide the model's 4 attention heads"):
        AsyncEngine(ServerConfig(model=tiny_llada, tensor_parallel_size=3))
    with pytest.raises(ValueError, match="offline LLM runs one process"):
        LLM(tiny_llada, tensor_parallel_size=2)


async def test_each_rank_holds_half_the_weights_in_resident_memory(tmp_path):
    """Measured, not computed: the anonymous resident memory loading added to each process (/proc statm around
    the load, the allocator trimmed), TP=2 per rank against TP=1, on a model of 109 MB of float32 weights. A
    rank saves half the weights and holds at most 0.6x what TP=1 holds (issue 44's bound; docs/parallelism.md)."""
    from dllm_server.model.tiny import make_tiny_model
    path = make_tiny_model(tmp_path / "m", arch="llada", hidden=512, layers=8, heads=8, mlp=1536, seed=3)
    weights_mb = 8 * (4 * 512 * 512 + 3 * 512 * 1536) * 4 / 2**20
    held, whole = {}, {}
    for tp in (1, 2):
        config = ServerConfig(model=str(path), block_length=8, dtype="float32", threads_per_worker=1,
                              tensor_parallel_size=tp)
        async with running(config) as engine:
            held[tp] = engine.stats().workers[0].rank_weights_mb
            whole[tp] = engine.stats().workers[0].rank_rss_mb
    print(f"\nweights resident per rank (MB): TP=1 {held[1]}, TP=2 {held[2]} (weights {weights_mb:.0f} MB); "
          f"whole process: TP=1 {whole[1]}, TP=2 {whole[2]}")
    assert len(held[1]) == 1 and len(held[2]) == 2 and held[1][0] >= weights_mb
    for rank in held[2]:
        assert held[1][0] - rank == pytest.approx(weights_mb / 2, rel=0.25), held
        assert rank <= 0.6 * held[1][0], held
