"""SIMULATED (GPU roofline, costmodel/gpu.py): what tensor parallelism buys an instance of LLaDA-8B or
Dream-7B on H100 / H200, per degree: batch-1 and batch-32 block steps, a prefill, per-GPU throughput, KV pool.

    python -m bench.sim_tp [--model llada-8b] [--device h100] [--canvas 600] [--json out.json]
"""
from __future__ import annotations

import json

from bench.harness import Report, parser
from dllm_server.costmodel.gpu import MODELS, gpu_cost
from dllm_server.costmodel.iteration import IterationStats


def main() -> None:
    ap = parser(__doc__, json_out=True)
    ap.add_argument("--model", default="llada-8b", choices=sorted(MODELS))
    ap.add_argument("--device", default="h100", choices=("h100", "h200"))
    ap.add_argument("--canvas", type=int, default=600, help="keys per decode (canvas length)")
    a = ap.parse_args()
    m = MODELS[a.model]
    degrees = [d for d in (1, 2, 4, 8) if m.heads % d == 0 and m.kv_heads % d == 0]
    print(f"SIMULATED: {a.model} on {a.device}, roofline cost model (costmodel/gpu.py), canvas {a.canvas}\n")
    report = Report(a.json)
    table = report.table(["TP", ("batch-1 turn (ms)", ".2f"), ("speed-up", ".2f"), ("batch-32 turn (ms)", ".2f"),
                          ("speed-up", ".2f"), ("per-GPU throughput vs TP1", ".2f"), ("prefill 1024 (ms)", ".2f"),
                          ("KV pool (tokens)", ",")])
    base = None
    for d in degrees:
        c = gpu_cost(a.model, a.device, tp=d)
        b1 = c.turn_s(IterationStats(decode_tokens=32, decode_keys=a.canvas, num_decodes=1))
        b32 = c.turn_s(IterationStats(decode_tokens=32 * 32, decode_keys=32 * a.canvas, num_decodes=32))
        pre = c.turn_s(IterationStats(prefill_tokens=1024, prefill_sq=1024 ** 2, num_prefills=1))
        base = base or (b1, b32)
        table.row(d, 1e3 * b1, base[0] / b1, 1e3 * b32, base[1] / b32, base[1] / b32 / d, 1e3 * pre,
                  c.kv_pool_tokens())
    constants = {k: v for k, v in gpu_cost(a.model, a.device, tp=2).describe().items()
                 if k in ("all_reduce", "efficiency", "device")}
    print("\nconstants:\n" + json.dumps(constants, indent=1))
    report.add(constants=constants)
    report.save()


if __name__ == "__main__":
    main()
