"""Simulated (GPU roofline, costmodel/gpu.py): what tensor parallelism buys an instance of LLaDA-8B
or Dream-7B on H100 / H200, per degree: a batch-1 and a batch-32 dual-cache block step, a 1024-token
prefill, per-GPU throughput against TP=1 and the instance's KV pool. Every constant is the cost
model's (printed with its source); nothing here was measured on a GPU.

    python bench/sim_tp.py [--model llada-8b] [--device h100]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dllm_server.costmodel.gpu import MODELS, gpu_cost  # noqa: E402
from dllm_server.costmodel.iteration import IterationStats  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llada-8b", choices=sorted(MODELS))
    ap.add_argument("--device", default="h100", choices=("h100", "h200"))
    ap.add_argument("--canvas", type=int, default=600, help="keys per decode (canvas length)")
    a = ap.parse_args()
    m = MODELS[a.model]
    degrees = [d for d in (1, 2, 4, 8) if m.heads % d == 0 and m.kv_heads % d == 0]
    print(f"SIMULATED: {a.model} on {a.device}, roofline cost model (costmodel/gpu.py), canvas {a.canvas}\n")
    print("| TP | batch-1 turn (ms) | speed-up | batch-32 turn (ms) | speed-up | per-GPU throughput vs TP1 | "
          "prefill 1024 (ms) | KV pool (tokens) |\n|---|---|---|---|---|---|---|---|")
    base = None
    for d in degrees:
        c = gpu_cost(a.model, a.device, tp=d)
        b1 = c.turn_s(IterationStats(decode_tokens=32, decode_keys=a.canvas, num_decodes=1))
        b32 = c.turn_s(IterationStats(decode_tokens=32 * 32, decode_keys=32 * a.canvas, num_decodes=32))
        pre = c.turn_s(IterationStats(prefill_tokens=1024, prefill_sq=1024 ** 2, num_prefills=1))
        base = base or (b1, b32)
        print(f"| {d} | {1e3 * b1:.2f} | {base[0] / b1:.2f} | {1e3 * b32:.2f} | {base[1] / b32:.2f} | "
              f"{base[1] / b32 / d:.2f} | {1e3 * pre:.2f} | {c.kv_pool_tokens():,} |")
    print("\nconstants:\n" + json.dumps({k: v for k, v in gpu_cost(a.model, a.device, tp=2).describe().items()
                                          if k in ("all_reduce", "efficiency", "device")}, indent=1))


if __name__ == "__main__":
    main()
