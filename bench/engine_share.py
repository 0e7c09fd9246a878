"""Engine efficiency at saturation against model width: the share of the dense-matmul rate serving
reaches (bench/paper.py's experiment D) for a demo model and random LLaDA checkpoints of larger width.

    python -m bench.engine_share [--model training/demo-v1] [--widths 512,1024] [--requests 32] [--dtype float32]
"""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import torch

from bench.harness import Report, engine_workload, parser
from bench.paper import linear_params, saturation_share
from dllm_server.config import ServerConfig
from dllm_server.engine.async_engine import AsyncEngine
from dllm_server.model.tiny import make_tiny_model


async def one(model: str | None, n: int, dtype: str) -> tuple[object, dict]:
    base = ServerConfig(model=model, dtype=dtype, threads_per_worker=1)
    engine = AsyncEngine(base)
    await engine.start()
    a = engine.model_info
    await engine.shutdown(0)
    return a, await saturation_share(base, engine_workload("decode-heavy", n, 1000.0, seed=4, model=model), a, dtype)


async def main() -> None:
    ap = parser(__doc__, model="the demo model's row (default: the embedded demo model)", json_out=True)
    ap.add_argument("--widths", default="512,1024",
                    help="hidden sizes of the random checkpoints (4 layers, MLP 2.75x, head dim 128 from 1024, "
                         "else 64)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    print(f"# engine share of the dense-matmul rate at saturation: {args.requests} decode-heavy requests at once, "
          f"1 worker thread, {args.dtype}, block 32, threshold 0.9, dual cache, torch {torch.__version__}\n")
    report = Report(args.json)
    table = report.table(["model", "hidden", "layers", ("parameters (M, linear)", ".1f"), "loaded iterations",
                          "tokens fed", ("forward time (s)", ".2f"), ("model GFLOP/s", ".1f"),
                          ("dense matmul GFLOP/s at its rows", ".1f"), "share", "linear only", ("output tok/s", ".1f")])
    with tempfile.TemporaryDirectory() as tmp:
        models: list[tuple[str, str | None]] = [(args.model or "embedded demo model", args.model)]
        for w in (int(x) for x in args.widths.split(",") if x):
            heads = w // (128 if w >= 1024 else 64)
            path = make_tiny_model(Path(tmp) / f"d{w}", hidden=w, layers=4, heads=heads, mlp=int(2.75 * w) // 64 * 64)
            models.append((f"random LLaDA d={w}", str(path)))
        for name, path in models:
            a, r = await one(path, args.requests, args.dtype)
            table.row(name, a.hidden, a.num_layers, linear_params(a) / 1e6, r["iters"], r["fed"], r["forward_s"],
                      r["model_flops"] / 1e9, r["peak"] / 1e9, f"**{100 * r['share']:.0f} %**",
                      f"{100 * r['linear_share']:.0f} %", r["tok_s"])
    report.save()


if __name__ == "__main__":
    asyncio.run(main())
