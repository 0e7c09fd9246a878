"""Engine efficiency at saturation against model width, in one run: the share of the dense-matmul
rate that serving reaches (bench/paper.py's experiment D) for a demo model (--model; the
embedded one by default) and for
seeded random LLaDA checkpoints of larger width (`dllm-server make-tiny-model`, 4 layers, byte
tokenizer). The per-token costs outside the matmuls (norms, rotary, SwiGLU, attention's calls,
the runner's host work) grow with width more slowly than the matmuls, so the share at a demo
model's width (v1: d=256, v2: d=320) says
little about a served 8B model (d=4096); the sweep shows the trend on this CPU.

    python bench/engine_share.py [--model training/demo-v1] [--widths 512,1024] [--requests 32] [--dtype float32]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_server.config import ServerConfig  # noqa: E402
from dllm_server.engine.async_engine import AsyncEngine  # noqa: E402
from dllm_server.model.tiny import make_tiny_model  # noqa: E402
from common import model_info  # noqa: E402  (bench/, the script's folder)
from paper import linear_params, saturation_share, workload  # noqa: E402


async def one(model: str | None, n: int, dtype: str) -> tuple[object, dict]:
    base = ServerConfig(model=model, dtype=dtype, threads_per_worker=1)
    engine = AsyncEngine(base)
    await engine.start()
    a = model_info(engine)
    await engine.shutdown(0)
    return a, await saturation_share(base, workload("decode-heavy", n, 1000.0, seed=4, model=model), a, dtype)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="512,1024", help="hidden sizes of the random checkpoints (MLP 2.75x, head dim 128 from 1024, else 64)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--model", help="the demo model's row (default: the embedded demo model)")
    args = ap.parse_args()
    print(f"# engine share of the dense-matmul rate at saturation: {args.requests} decode-heavy requests at once, "
          f"1 worker thread, {args.dtype}, block 32, threshold 0.9, dual cache, torch {torch.__version__}\n")
    print("| model | hidden | layers | parameters (M, linear) | loaded iterations | tokens fed | forward time (s) | "
          "model GFLOP/s | dense matmul GFLOP/s at its rows | share | linear only | output tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        models: list[tuple[str, str | None]] = [(args.model or "embedded demo model", args.model)]
        for w in (int(x) for x in args.widths.split(",") if x):
            heads = w // (128 if w >= 1024 else 64)
            path = make_tiny_model(Path(tmp) / f"d{w}", hidden=w, layers=4, heads=heads, mlp=int(2.75 * w) // 64 * 64)
            models.append((f"random LLaDA d={w}", str(path)))
        for name, path in models:
            a, r = await one(path, args.requests, args.dtype)
            print(f"| {name} | {a.hidden} | {a.num_layers} | {linear_params(a) / 1e6:.1f} | {r['iters']} | {r['fed']} | "
                  f"{r['forward_s']:.2f} | {r['model_flops'] / 1e9:.1f} | {r['peak'] / 1e9:.1f} | "
                  f"**{100 * r['share']:.0f} %** | {100 * r['linear_share']:.0f} % | {r['tok_s']:.1f} |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
