"""Block-causal (SDAR) against bidirectional (LLaDA) serving on equal random checkpoints, one colocated
worker: A saturation at block 4 and 32, B the prefix cache, C fused against separate finalise.

    python -m bench.block_causal [--requests 32] [--skip C] [--json out.json]     # ~3 minutes on 2 cores
"""
from __future__ import annotations

import asyncio
import statistics
import tempfile
from pathlib import Path

import numpy as np

from bench.harness import Report, Timer, parser
from dllm_server import LLM, SamplingParams
from dllm_server.config import ServerConfig
from dllm_server.decoding.canvas import num_blocks
from dllm_server.engine.async_engine import AsyncEngine
from dllm_server.model.tiny import make_tiny_model

# The demo model's shape, random weights: what is compared is cost per commit, not answer quality
# (a fixed-steps rule commits 2 positions per forward, so both models commit the same).
SHAPE = dict(hidden=320, layers=6, heads=4, kv_heads=4, mlp=864, max_len=2048)


def _requests(n: int, seed: int, prompt_lens, answer_lens, shared: list[int] | None = None,
              per_forward: int = 2, block: int = 4, absolute: bool = False):
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        plen = int(rng.choice(prompt_lens))
        prompt = (shared or []) + rng.integers(1, 250, plen).tolist()
        m = int(rng.choice(answer_lens))
        steps = max(num_blocks(m, block, len(prompt), absolute), m // per_forward)
        reqs.append(({"prompt_token_ids": prompt},
                     SamplingParams(max_tokens=m, steps=steps, ignore_eos=True, seed=i)))
    return reqs


async def _serve(config: ServerConfig, reqs) -> dict:
    engine = AsyncEngine(config)
    await engine.start(timeout_s=300)
    try:
        await asyncio.gather(*[engine.run(p, s) for p, s in reqs[:2]])     # warm-up
        pos0 = engine.stats().counters.canvas_positions
        pc0 = engine.stats().workers[0].prefix_cache or (0, 0, 0, 0)

        async def one(p, s):
            with Timer() as t:
                out = await engine.run(p, s)
            return out, t.s
        with Timer() as run:
            results = await asyncio.gather(*[one(p, s) for p, s in reqs])
        wall = run.s
        st = engine.stats()
        pc = st.workers[0].prefix_cache or (0, 0, 0, 0)
        outs = [o for o, _ in results]
        return {"wall": wall, "n": len(reqs), "tokens": sum(len(o.token_ids) for o in outs),
                "forwards": statistics.mean(o.stats.num_forwards for o in outs),
                "positions": (st.counters.canvas_positions - pos0) / len(reqs),
                "latency": statistics.mean(t for _, t in results),
                "hits": pc[0] - pc0[0], "queries": pc[1] - pc0[1], "outs": [o.token_ids for o in outs]}
    finally:
        await engine.shutdown(0)


def part_a(args, tmp: Path, report: Report) -> None:
    print(f"\nA. saturation: {args.requests} requests at once, prompts {args.prompts}, answers {args.answers}, "
          "2 positions per forward (fixed steps), one colocated worker, 2 threads\n")
    table = report.table(["model", "block", ("req/s", ".2f"), ("tok/s", ".1f"), ("fwd/answer", ".1f"),
                          ("pos fed/answer", ".0f"), ("mean latency s", ".2f")])
    for block in (4, 32):
        row = {}
        for arch in ("llada", "sdar"):
            path = make_tiny_model(tmp / f"{arch}{block}", arch=arch, seed=1, block_size=block, **SHAPE)
            reqs = _requests(args.requests, 3, args.prompts, args.answers, block=block, absolute=arch == "sdar")
            cfg = ServerConfig(model=str(path), block_length=block, threads_per_worker=2, dtype="float32")
            r = row[arch] = asyncio.run(_serve(cfg, reqs))
            table.row(arch, block, r["n"] / r["wall"], r["tokens"] / r["wall"], r["forwards"], r["positions"],
                      r["latency"])
        a, b = row["llada"], row["sdar"]
        table.row("sdar / llada", block, f"{a['wall'] / b['wall']:.2f}x", "", f"{b['forwards'] / a['forwards']:.2f}x",
                  f"{b['positions'] / a['positions']:.2f}x", "")


def part_b(args, tmp: Path, report: Report) -> None:
    rng = np.random.default_rng(5)
    shared = rng.integers(1, 250, args.system_prompt).tolist()
    print(f"\nB. prefix cache: SDAR block 4, {args.requests} requests at once sharing a {args.system_prompt}-token "
          "system prompt (+ 8-24 own tokens), answers 32, 2 positions per forward\n")
    path = make_tiny_model(tmp / "sdar4pc", arch="sdar", seed=1, block_size=4, **SHAPE)
    reqs = _requests(args.requests, 7, [8, 16, 24], [32], shared=shared, absolute=True)
    table = report.table(["prefix cache", ("req/s", ".2f"), ("pos fed/request", ".0f"), ("mean latency s", ".2f"),
                          ("hit rate", ".2f")])
    rows = {}
    for on in (False, True):
        cfg = ServerConfig(model=str(path), block_length=4, threads_per_worker=2, dtype="float32",
                           enable_prefix_caching=on)
        r = rows[on] = asyncio.run(_serve(cfg, reqs))
        table.row("on" if on else "off", r["n"] / r["wall"], r["positions"], r["latency"],
                  r["hits"] / r["queries"] if r["queries"] else "-")
    table.row("on / off", f"{rows[False]['wall'] / rows[True]['wall']:.2f}x",
              f"{rows[True]['positions'] / rows[False]['positions']:.2f}x", "", "")
    print(f"answers identical: {rows[True]['outs'] == rows[False]['outs']}")


def part_c(args, tmp: Path, report: Report) -> None:
    print("\nC. finalise: SDAR block 4, one request at a time (prompt 128, answer 128), offline LLM\n")
    path = make_tiny_model(tmp / "sdar4f", arch="sdar", seed=1, block_size=4, **SHAPE)
    reqs = _requests(8, 9, [128], [128], absolute=True)
    table = report.table(["finalise", ("model fwd/answer", ".1f"), ("s/answer", ".3f")])
    rows = {}
    for mode in ("fused", "separate"):
        llm = LLM(str(path), dtype="float32", block_causal_finalise=mode)
        llm.generate([reqs[0][0]], [reqs[0][1]])                      # warm-up
        n0 = llm.core.stepper.num_forwards
        with Timer() as t:
            outs = [llm.generate([p], [s])[0].token_ids for p, s in reqs]
        rows[mode] = ((llm.core.stepper.num_forwards - n0) / len(reqs), t.s / len(reqs), outs)
        table.row(mode, rows[mode][0], rows[mode][1])
    f, s = rows["fused"], rows["separate"]
    table.row("fused/sep", f"{f[0] / s[0]:.2f}x", f"{f[1] / s[1]:.2f}x")
    print(f"answers identical: {f[2] == s[2]}")


def main() -> None:
    ap = parser(__doc__, json_out=True)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompts", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--answers", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--system-prompt", type=int, default=512)
    ap.add_argument("--skip", nargs="*", default=[], choices=["A", "B", "C"])
    args = ap.parse_args()
    report = Report(args.json)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, part in (("A", part_a), ("B", part_b), ("C", part_c)):
            if name not in args.skip:
                part(args, tmp, report)
    report.save()


if __name__ == "__main__":
    main()
