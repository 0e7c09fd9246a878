"""Block-causal (SDAR) against bidirectional (LLaDA) serving, and what the prefix cache buys, on
this CPU with real worker processes (AsyncEngine, one colocated worker), side by side in one run:

  A. saturation: the same requests (prompt lengths, answer lengths, 2 positions committed per
     forward by a fixed-steps rule, so both models do the same commits) on random checkpoints of
     equal shape: LLaDA (dual cache, a re-prefill of the whole canvas at every block) and SDAR
     (exact KV: one prefill, then the block alone; fused finalise), at block 4 and 32. Requests/s,
     answer tokens/s, forwards per answer and canvas positions fed per answer.
  B. the prefix cache: SDAR, many requests sharing a long system prompt, cache on and off:
     requests/s, positions fed, mean latency, and the hit rate.
  C. fused finalise against a separate finalising forward, one request at a time: model forwards
     per answer and seconds per answer.

    python bench/block_causal.py                  # ~3 minutes on 2 cores
    python bench/block_causal.py --requests 16 --skip C

Random weights: what is compared is cost per commit, not answer quality (the commit rule is
fixed, so both models commit the same number of positions per forward). Reported as measured.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_server import LLM, SamplingParams  # noqa: E402
from dllm_server.config import ServerConfig  # noqa: E402
from dllm_server.decoding.canvas import num_blocks  # noqa: E402
from dllm_server.engine.async_engine import AsyncEngine  # noqa: E402
from dllm_server.model.tiny import make_tiny_model  # noqa: E402

SHAPE = dict(hidden=320, layers=6, heads=4, kv_heads=4, mlp=864, max_len=2048)   # the demo model's shape


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
        t0 = time.perf_counter()

        async def one(p, s):
            t = time.perf_counter()
            out = await engine.run(p, s)
            return out, time.perf_counter() - t
        results = await asyncio.gather(*[one(p, s) for p, s in reqs])
        wall = time.perf_counter() - t0
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


def part_a(args, tmp: Path) -> None:
    print(f"\nA. saturation: {args.requests} requests at once, prompts {args.prompts}, answers {args.answers}, "
          "2 positions per forward (fixed steps), one colocated worker, 2 threads")
    print(f"{'model':<16}{'block':>6}{'req/s':>8}{'tok/s':>8}{'fwd/answer':>11}{'pos fed/answer':>15}"
          f"{'mean latency s':>15}")
    for block in (4, 32):
        row = {}
        for arch in ("llada", "sdar"):
            path = make_tiny_model(tmp / f"{arch}{block}", arch=arch, seed=1, block_size=block, **SHAPE)
            reqs = _requests(args.requests, 3, args.prompts, args.answers, block=block, absolute=arch == "sdar")
            cfg = ServerConfig(model=str(path), block_length=block, threads_per_worker=2, dtype="float32")
            r = row[arch] = asyncio.run(_serve(cfg, reqs))
            print(f"{arch:<16}{block:>6}{r['n'] / r['wall']:>8.2f}{r['tokens'] / r['wall']:>8.1f}"
                  f"{r['forwards']:>11.1f}{r['positions']:>15.0f}{r['latency']:>15.2f}")
        a, b = row["llada"], row["sdar"]
        print(f"{'sdar / llada':<16}{block:>6}{a['wall'] / b['wall']:>7.2f}x{'':>8}"
              f"{b['forwards'] / a['forwards']:>10.2f}x{b['positions'] / a['positions']:>14.2f}x")


def part_b(args, tmp: Path) -> None:
    rng = np.random.default_rng(5)
    shared = rng.integers(1, 250, args.system_prompt).tolist()
    print(f"\nB. prefix cache: SDAR block 4, {args.requests} requests at once sharing a {args.system_prompt}-token "
          "system prompt (+ 8-24 own tokens), answers 32, 2 positions per forward")
    path = make_tiny_model(tmp / "sdar4pc", arch="sdar", seed=1, block_size=4, **SHAPE)
    reqs = _requests(args.requests, 7, [8, 16, 24], [32], shared=shared, absolute=True)
    print(f"{'prefix cache':<14}{'req/s':>8}{'pos fed/request':>16}{'mean latency s':>15}{'hit rate':>10}")
    rows = {}
    for on in (False, True):
        cfg = ServerConfig(model=str(path), block_length=4, threads_per_worker=2, dtype="float32",
                           enable_prefix_caching=on)
        r = rows[on] = asyncio.run(_serve(cfg, reqs))
        rate = f"{r['hits'] / r['queries']:.2f}" if r["queries"] else "-"
        print(f"{'on' if on else 'off':<14}{r['n'] / r['wall']:>8.2f}{r['positions']:>16.0f}{r['latency']:>15.2f}"
              f"{rate:>10}")
    print(f"{'on / off':<14}{rows[False]['wall'] / rows[True]['wall']:>7.2f}x"
          f"{rows[True]['positions'] / rows[False]['positions']:>15.2f}x   answers identical: "
          f"{rows[True]['outs'] == rows[False]['outs']}")


def part_c(args, tmp: Path) -> None:
    print("\nC. finalise: SDAR block 4, one request at a time (prompt 128, answer 128), offline LLM")
    path = make_tiny_model(tmp / "sdar4f", arch="sdar", seed=1, block_size=4, **SHAPE)
    reqs = _requests(8, 9, [128], [128], absolute=True)
    print(f"{'finalise':<10}{'model fwd/answer':>17}{'s/answer':>10}")
    rows = {}
    for mode in ("fused", "separate"):
        llm = LLM(str(path), dtype="float32", block_causal_finalise=mode)
        llm.generate([reqs[0][0]], [reqs[0][1]])                      # warm-up
        n0, t0 = llm.core.stepper.num_forwards, time.perf_counter()
        outs = [llm.generate([p], [s])[0].token_ids for p, s in reqs]
        rows[mode] = ((llm.core.stepper.num_forwards - n0) / len(reqs), (time.perf_counter() - t0) / len(reqs), outs)
        print(f"{mode:<10}{rows[mode][0]:>17.1f}{rows[mode][1]:>10.3f}")
    f, s = rows["fused"], rows["separate"]
    print(f"{'fused/sep':<10}{f[0] / s[0]:>16.2f}x{f[1] / s[1]:>9.2f}x   answers identical: {f[2] == s[2]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompts", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--answers", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--system-prompt", type=int, default=512)
    ap.add_argument("--skip", nargs="*", default=[], choices=["A", "B", "C"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, part in (("A", part_a), ("B", part_b), ("C", part_c)):
            if name not in args.skip:
                part(args, tmp)


if __name__ == "__main__":
    main()
