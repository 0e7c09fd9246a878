"""The policy seam on real worker processes: a runtime SetPolicy changes what the worker's next
iterations do (seen in its own iteration reports), and per-block thresholds chosen by the front
process decode exactly as the offline API does with the same per-block thresholds."""
import asyncio

from dllm_server import LLM, SamplingParams
from dllm_server.engine.async_engine import AsyncEngine
from dllm_server.policy.base import FixedPolicy, ThresholdSchedule

from tests.live import running


def _requests(n=8):
    # 40-token prompts, 2 blocks of 8 decoded one position per forward: long-lived decodes
    return [({"prompt_token_ids": [(i * 7 + j) % 200 + 1 for j in range(40)]},
             SamplingParams(max_tokens=16, steps=16, ignore_eos=True, seed=i)) for i in range(n)]


async def _run_all(engine, reqs):
    return await asyncio.gather(*[engine.run(p, s) for p, s in reqs])


async def test_set_policy_changes_the_next_iterations(engine_config):
    async with running(engine_config) as engine:
        before = await _run_all(engine, _requests())
        old = [r for _, r in engine.iteration_trace()]
        engine.set_policy(token_budget=16, max_active_decodes=2)
        new_policy = engine.stats().workers[0].policy
        assert (new_policy.token_budget, new_policy.max_active_decodes) == (16, 2)
        after = await _run_all(engine, _requests())
        reports = [r for _, r in engine.iteration_trace()][len(old):]
    applied = [r for r in reports if r.policy == new_policy]
    assert applied and all(r.policy == new_policy for r in reports[reports.index(applied[0]):])
    # before: up to 8 seated decodes, several 56-token prefills admitted in one iteration (tau 1024)
    assert max(r.num_active_decodes for r in old) > 2 and max(r.num_prefills for r in old) > 1
    # after: never more than 2 seated; tau=16 < one prefill: at most one admitted per iteration
    assert max(r.num_active_decodes for r in applied) <= 2
    assert max(r.num_prefills for r in applied) == 1
    assert [o.token_ids for o in after] == [o.token_ids for o in before]      # scheduling never changes tokens


async def test_per_block_thresholds_match_the_offline_api(engine_config, tiny_llada):
    schedule = [0.95, 0.2, 0.6, 0.05]
    reqs = [({"prompt_token_ids": [i + 1, 9, 4, 2 * i + 3]},
             SamplingParams(max_tokens=32, ignore_eos=True, seed=i, temperature=0.8 * (i % 2))) for i in range(6)]
    offline = LLM(tiny_llada, block_length=8, dtype="float32", policy=ThresholdSchedule(schedule))
    want = offline.generate([p for p, _ in reqs], [s for _, s in reqs])
    fixed = LLM(tiny_llada, block_length=8, dtype="float32", policy=FixedPolicy(0.95))
    plain = fixed.generate([p for p, _ in reqs], [s for _, s in reqs])
    engine = AsyncEngine(engine_config, policy=ThresholdSchedule(schedule))
    await engine.start(timeout_s=120)
    try:
        got = await _run_all(engine, reqs)
    finally:
        await engine.shutdown(0)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for o in got:
        assert [p.threshold for p in o.stats.block_policies] == schedule    # what each block ran with
    # the schedule really changed the decoding: fewer forwards than threshold 0.95 throughout
    assert sum(o.stats.num_forwards for o in got) < sum(o.stats.num_forwards for o in plain)


async def test_the_engine_is_ready_only_once_start_has_read_the_model(engine_config):
    """The workers' readiness wakes start() one loop turn later; a /health probe in that turn found the engine ready
    with no model info yet (a 500 in a CI soak). Every loop turn while it starts: ready implies the model is known."""
    engine = AsyncEngine(engine_config)
    starting = asyncio.ensure_future(engine.start(timeout_s=120))
    seen = []
    while not starting.done():
        seen.append((engine.is_ready, engine.model_info is not None))
        await asyncio.sleep(0)
    try:
        await starting
        assert engine.is_ready and all(known for ready, known in seen if ready)
    finally:
        await engine.shutdown(0)
