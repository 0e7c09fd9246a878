"""The load model's capacity estimate (WorkerLoadModel.capacity, request-forwards per second) against
what a saturated worker ran, for one- and multi-block answers, before and after issue 33's fix.

    python -m bench.capacity_check [--concurrency 16] [--seconds 20] [--max-tokens 32 128] [--json out.json]
"""
from __future__ import annotations

import asyncio
import time

from bench.harness import Report, parser
from dllm_server import SamplingParams
from dllm_server.checkpoint import plain_id_offset_of
from dllm_server.config import ServerConfig
from dllm_server.costmodel.step_time import features, report_features
from dllm_server.engine.async_engine import AsyncEngine


def estimate_before_fix(load, arrival_rate: float) -> float:
    """The estimate as it was before issue 33's fix (commit 849bb6d, costmodel/worker_speed.py and
    worker_speed.capacity_rate), restated here on today's fitted models so the two differ only in
    the formula: one recompute step per request (its first prefill), keys per decode row from the
    worker's seated count rather than the last iteration's rows, and recompute steps not counted
    as forwards of their requests."""
    total = 0.0
    ready = [w for w, m in load.models.items() if m.ready]
    for w in ready:
        m, r = load.models[w], load.reports.get(w)
        seats = r.policy.max_active_decodes if r is not None and r.policy is not None else 64
        keys = r.decode_keys / r.num_active_decodes if r is not None and r.num_active_decodes else 256
        lam = arrival_rate / len(ready)
        best = 0.0
        for n in range(1, max(1, seats) + 1):
            t0 = m.predict(features(n * load.block_length, n * keys))
            share = lam * t0
            t = m.predict(features(n * load.block_length, n * keys, share * keys, share * keys * keys,
                                   recompute=True)) if share > 0 else t0
            if t > 0:
                best = max(best, n / t)
        total += best
    return total


async def saturate(config: ServerConfig, concurrency: int, seconds: float, max_tokens: int) -> dict:
    """`concurrency` requests in flight at all times (closed loop), each `max_tokens` long, with
    max_active_decodes = the concurrency so that the estimate and the run seat the same batch.
    Measured: request-forwards (decode plus prefill rows) over the iterations' seconds."""
    engine = AsyncEngine(config)
    await engine.start(timeout_s=300)
    first = 1 + plain_id_offset_of(config.model)
    done, blocks, stop_at = [], [], [0.0]

    async def client(i: int) -> None:
        k = 0
        while time.monotonic() < stop_at[0]:
            prompt = [first + (i * 31 + k * 7 + j) % 200 for j in range(48)]
            out = await engine.run({"prompt_token_ids": prompt},
                                   SamplingParams(max_tokens=max_tokens, ignore_eos=True, threshold=0.9, seed=k))
            done.append(time.monotonic())
            blocks.append(len(out.stats.steps_per_block))
            k += 1
    try:
        stop_at[0] = time.monotonic() + 3.0                    # warm-up: fills the batch, refits the model
        await asyncio.gather(*[client(i) for i in range(concurrency)])
        n0, t0 = len(engine.iteration_trace()), time.monotonic()
        done.clear(), blocks.clear()
        stop_at[0] = t0 + seconds
        await asyncio.gather(*[client(i) for i in range(concurrency)])
        reports = [r for _, r in engine.iteration_trace()[n0:] if r.iteration_tokens]
        span = done[-1] - t0
        block = config.block_length
        rows = sum((r.iteration_tokens - r.prefill_tokens) / block + r.num_prefills for r in reports)
        measured = rows / sum(r.iteration_s for r in reports)
        rate = len(done) / span
        mean_blocks = sum(blocks) / len(blocks)
        model = engine.load.models[0]
        predicted = sum(model.predict(report_features(r)) for r in reports) / sum(r.iteration_s for r in reports)
        return {"iteration_model_error": predicted - 1.0, "max_tokens": max_tokens, "blocks_per_request": mean_blocks,
                "completions_per_s": rate, "iterations": len(reports), "measured": measured,
                "before_fix": estimate_before_fix(engine.load, rate),
                "before": engine.load.capacity(float("inf"), rate, 1.0),
                "after": engine.load.capacity(float("inf"), rate, mean_blocks)}
    finally:
        await engine.shutdown(0)


def main() -> None:
    ap = parser(__doc__, model="checkpoint (default: the embedded demo model)", json_out=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[32, 128])
    a = ap.parse_args()
    config = ServerConfig(model=a.model, threshold_policy="slo", max_active_decodes=a.concurrency, threads_per_worker=1)
    rows = [asyncio.run(saturate(config, a.concurrency, a.seconds, m)) for m in a.max_tokens]
    print(f"capacity estimate vs measured, {a.concurrency} requests in flight, {a.seconds:g} s each "
          f"(request-forwards per second)\n")
    report = Report(a.json)
    table = report.table(["max_tokens", ("blocks / request", ".2f"), ("completions / s", ".2f"), ("measured", ".0f"),
                          ("before the fix (849bb6d's formula)", ".0f"), "error",
                          ("today's, 1 recompute / request", ".0f"), "error", ("today's, 1 / block (after)", ".0f"),
                          "error", "step-time model on the run's own iterations"])
    for r in rows:
        m = r["measured"]
        err = lambda v: f"{100 * (v - m) / m:+.0f} %"
        table.row(r["max_tokens"], r["blocks_per_request"], r["completions_per_s"], m, r["before_fix"],
                  err(r["before_fix"]), r["before"], err(r["before"]), r["after"], err(r["after"]),
                  f"{100 * r['iteration_model_error']:+.0f} %")
    report.save()


if __name__ == "__main__":
    main()
