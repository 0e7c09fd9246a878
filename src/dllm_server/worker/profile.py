"""A start-up profile of a worker's iteration time, which seeds the front's step-time model before real traffic:
real iterations of the core on synthetic prefills and decodes at batch 1 to 4."""
from __future__ import annotations

import time

import torch

from ..decoding.params import BlockPolicy, SamplingParams
from ..messages import Abort, SubmitBlock
from .core import WorkerCore


def profile_iterations(core: WorkerCore, max_len: int, vocab_size: int, passes: int = 2) -> tuple[tuple[float, ...], ...]:
    """Run the profile `passes` times and keep the last (the first pays one-off kernel set-up)."""
    rows: tuple[tuple[float, ...], ...] = ()
    cache, core.prefix_cache = core.prefix_cache, None    # its same-token prompts would hit: not the cost
    try:
        for _ in range(passes):
            rows = _profile_once(core, max_len)
    finally:
        core.prefix_cache = cache
    return rows


def _profile_once(core: WorkerCore, max_len: int) -> tuple[tuple[float, ...], ...]:
    model_block = core.stepper.args.block_size
    block = model_block or core.config.block_length
    token = 1 if core.mask_id != 1 else 2
    params = SamplingParams(max_tokens=block).resolve(block, 0, model_block)
    slow = BlockPolicy(1.0, steps=block)                  # one commit per forward: stays seated
    rows: list[tuple[float, ...]] = []

    def submit(rid: str, canvas_len: int) -> None:
        prompt = max(1, canvas_len - block)
        canvas = torch.full((prompt + block,), core.mask_id, dtype=torch.int64)
        canvas[:prompt] = token
        core.submit(SubmitBlock(rid, 0, prompt, canvas, params, slow, (), -1))

    def step(n: int = 1) -> None:
        for _ in range(n):
            t = time.perf_counter()
            core.step()
            s = core.last
            rows.append((float(s.decode_tokens), float(s.decode_keys), float(s.prefill_tokens),
                         float(s.prefill_sq), time.perf_counter() - t))

    lengths = [n for n in (192, 448) if n + block <= max_len and core.pool.pages_needed(n + block) * 5
               <= core.pool.num_pages] or [min(max_len, 2 * block)]
    ids = [f"\x00profile{i}" for i in range(4)]
    try:
        for rid in ids:
            submit(rid, lengths[0])
        step(1)
        step(3)
        for rid in ids[2:]:
            core.abort(Abort(rid))
        step(2)
        submit("\x00profile-long", lengths[-1])
        step(1)
        submit("\x00profile-short", lengths[0])
        step(1)
        core.abort(Abort(ids[1]))
        step(2)
    finally:
        for rid in ids + ["\x00profile-long", "\x00profile-short"]:
            core.abort(Abort(rid))
        core.deficit_tokens = 0
    return tuple(r for r in rows if r[4] > 0 and (r[0] or r[2]))
