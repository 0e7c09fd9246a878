"""Shared by the engine benchmarks (scheduler.py, paper.py, handoff.py): a Poisson workload of
token-id prompts and its open-loop replay against an AsyncEngine."""
from __future__ import annotations

import asyncio
import random
import time

from dllm_server import SamplingParams


def poisson_workload(n: int, rate: float, seed: int, prompt_lens, answer_lens, token_range=(1, 250)) -> list:
    """[(arrival_s, prompt, params)]: lengths drawn from the given choices, `ignore_eos`, seed i."""
    rng = random.Random(seed)
    t, reqs = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        prompt = [rng.randrange(*token_range) for _ in range(rng.choice(prompt_lens))]
        reqs.append((t, {"prompt_token_ids": prompt},
                     SamplingParams(max_tokens=rng.choice(answer_lens), ignore_eos=True, seed=i)))
    return reqs


async def replay(engine, reqs) -> tuple[list[float], list, float]:
    """Submit each request at its arrival time. Returns (latencies in completion order, outputs in
    request order, wall seconds)."""
    latencies, start = [], time.monotonic()

    async def one(at, prompt, params):
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        t0 = time.monotonic()
        out = await engine.run(prompt, params)
        latencies.append(time.monotonic() - t0)
        return out

    outs = await asyncio.gather(*[one(*r) for r in reqs])
    return latencies, outs, time.monotonic() - start
