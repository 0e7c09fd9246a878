"""Shared by the engine benchmarks (scheduler.py, paper.py, handoff.py): a Poisson workload of
token-id prompts and its open-loop replay against an AsyncEngine, both built on the load
generator's own arrival process and send loop (loadgen/arrivals.py, loadgen/run.py)."""
from __future__ import annotations

import time

import numpy as np

from dllm_server import SamplingParams
from loadgen.arrivals import arrival_offsets
from loadgen.run import open_loop
from loadgen.workload import random_ids


def median_time_s(fn, reps: int, warmup: int = 2) -> float:
    """The median wall time of `fn()` over `reps` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


def plain_id_offset(model: str | None) -> int:
    """checkpoint.plain_id_offset_of: the shift that keeps synthetic byte-range prompt ids clear of a
    BPE's special tokens. 0 in a tree from before it (bench/ab.py --ref ...): such trees know only
    byte-level models, whose specials sit above the bytes."""
    try:
        from dllm_server.checkpoint import plain_id_offset_of
    except ImportError:
        return 0
    return plain_id_offset_of(model)


def poisson_workload(n: int, rate: float, seed: int, prompt_lens, answer_lens, token_range=(1, 250),
                     offset: int = 0) -> list:
    """[(arrival_s, prompt, params)]: lengths drawn from the given choices, `ignore_eos`, seed i; ids
    from `token_range` shifted by `offset` (checkpoint.plain_id_offset_of: past a BPE's specials)."""
    rng = np.random.default_rng(seed)
    offsets = arrival_offsets("poisson", rate, n, rng)
    reqs = []
    for i, at in enumerate(offsets):
        prompt = random_ids(int(rng.choice(prompt_lens)), rng, token_range[1] + offset, token_range[0] + offset)
        reqs.append((float(at), {"prompt_token_ids": prompt},
                     SamplingParams(max_tokens=int(rng.choice(answer_lens)), ignore_eos=True, seed=i)))
    return reqs


async def replay(engine, reqs) -> tuple[list[float], list, float]:
    """Submit each request at its arrival time. Returns (latencies in completion order, outputs in
    request order, wall seconds)."""
    latencies = []

    async def one(i: int):
        _, prompt, params = reqs[i]
        t0 = time.monotonic()
        out = await engine.run(prompt, params)
        latencies.append(time.monotonic() - t0)
        return out

    start = time.perf_counter()
    outs = await open_loop([r[0] for r in reqs], one, start)
    return latencies, outs, time.perf_counter() - start


# ---- the engine's public surface, read so that bench/ab.py can also run these scripts against
# trees from before the engine seams (where the same facts lived on engine.scheduler) ----
def iteration_trace(engine) -> list:
    """Every worker iteration's LoadReport, in arrival order."""
    if hasattr(engine, "iteration_trace"):
        return [r for _, r in engine.iteration_trace()]
    return [r for _, r in engine.scheduler.trace]


def worker_pid(engine, wid: int = 0) -> int:
    return engine.stats().workers[wid].pid if hasattr(engine, "stats") else engine.pool.pid(wid)


def model_info(engine):
    return getattr(engine, "model_info", None) or engine.model_args


def worker_pages(engine, wid: int = 0) -> tuple[int, int | None]:
    """(pool pages, free pages as last reported or None before any report)."""
    if hasattr(engine, "stats"):
        w = engine.stats().workers[wid]
        return w.num_pages, w.free_pages if w.num_iterations else None
    w = engine.scheduler.workers[wid]
    return w.num_pages, w.report.free_pages if w.report else None



def step_items(llm, batch: int, prompt: int, block: int, canvas_len: int, tag: str) -> list:
    """B canvases whose first block after the prompt is open, their KV filled by a full forward:
    the forward items of one loaded decode iteration (dual cache)."""
    import torch
    from dllm_server.worker.runner import ForwardItem, fed_range
    a, pool = llm.args, llm.core.pool
    first = 1 + plain_id_offset(llm.config.model)
    items = []
    for b in range(batch):
        canvas = torch.full((canvas_len,), a.mask_id, dtype=torch.int64)
        canvas[:prompt] = torch.arange(prompt) % 200 + first + b
        alloc = pool.allocate(f"{tag}{b}", canvas_len)
        llm.runner.forward([ForwardItem(canvas, alloc, 0, canvas_len, prompt, prompt + block)])
        lo, hi = fed_range("dual", False, prompt, prompt + block, canvas_len, llm.core.stepper.lead)
        items.append(ForwardItem(canvas, alloc, lo, hi, prompt, prompt + block))
    return items
