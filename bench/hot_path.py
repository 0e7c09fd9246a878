"""The model hot path, in-process: the forward of B dual-cache block steps (one decode iteration of B
seated requests) and the batch-1 latency of `LLM.generate`; with several --model, their forwards
side by side over alternating rounds (a model swap that must not change the cost per forward).

    python -m bench.hot_path [--model DIR] [--dtype float32] [--batch 1 16 32] [--threads 1]
    python -m bench.hot_path --model training/demo-v2/model --model src/dllm_server/assets/demo-model [--rounds 3]
    python -m bench.ab --ref c495d1e --rounds 2 --script-from current -- bench.hot_path
"""
from __future__ import annotations

import json
import statistics
import zlib

import torch

from bench.harness import Report, Timer, median_time_s, parser, plain_ids, result, step_items
from dllm_server import LLM, SamplingParams


def forward_ms(llm, items, reps: int) -> float:
    return 1e3 * median_time_s(lambda: llm.runner.forward(items), reps, warmup=3)


def block_step_ms(llm, batch: int, prompt: int, block: int) -> float:
    """The median forward of `batch` dual-cache block steps over canvases of prompt + 4 blocks."""
    items = step_items(llm, batch, prompt, block, prompt + 4 * block, f"b{batch}_")
    ms = forward_ms(llm, items, max(10, 320 // batch))
    for i in range(batch):
        llm.core.pool.free(f"b{batch}_{i}")
    return ms


def one_model(a, report: Report) -> None:
    """Block steps at each batch, then LLM.generate at batch 1; the checksum of the generated
    tokens must match across bench/ab.py's sides."""
    llm = LLM(a.model[0], dtype=a.dtype, block_length=a.block)
    figures = {}
    print(f"dual-cache block steps: prompt {a.prompt}, block {a.block}, canvas {a.prompt + 4 * a.block}; {a.dtype}, "
          f"{a.threads} thread(s)\n")
    table = report.table(["batch", ("forward (ms)", ".2f"), ("per request (ms)", ".3f")])
    for b in a.batch:
        ms = figures[f"forward_b{b}_ms"] = block_step_ms(llm, b, a.prompt, a.block)
        table.row(b, ms, ms / b)
    first = 1 + plain_ids(a.model[0])
    prompts = [list(range(first + i, first + i + 40 + 8 * i)) for i in range(a.requests)]
    params = SamplingParams(max_tokens=a.max_tokens, ignore_eos=True)
    llm.generate({"prompt_token_ids": prompts[0]}, params)          # warm-up
    lat, forwards, crc = [], 0, 0
    for rep in range(3):
        for p in prompts:
            with Timer() as t:
                out = llm.generate({"prompt_token_ids": p}, params)[0]
            lat.append(t.s)
            forwards += out.stats.num_forwards if rep == 0 else 0
            crc = zlib.crc32(json.dumps(out.token_ids).encode(), crc) if rep == 0 else crc
    med = 1e3 * statistics.median(lat)
    figures.update(generate_b1_ms=med, generate_forwards=forwards, tokens_crc=crc)
    print(f"\nLLM.generate at batch 1: {a.requests} prompts x 3, {a.max_tokens} tokens each, median {med:.1f} ms "
          f"per request ({forwards} forwards over the {a.requests}; tokens crc32 {crc})")
    report.add(**figures)
    result(figures)


def several_models(a, report: Report) -> None:
    """Each model's block steps in turn, alternating over rounds so all see the same machine state."""
    llms = [LLM(m, dtype=a.dtype, block_length=a.block) for m in a.model]
    ms: dict[tuple[int, int], list[float]] = {}
    for _ in range(a.rounds):
        for b in a.batch:
            for k, llm in enumerate(llms):
                ms.setdefault((k, b), []).append(block_step_ms(llm, b, a.prompt, a.block))
    print(f"dual-cache block steps: prompt {a.prompt}, block {a.block}, canvas {a.prompt + 4 * a.block}; {a.dtype}, "
          f"{a.threads} thread(s); median of {a.rounds} alternating rounds (each a median of repeats)\n")
    table = report.table(["batch", *((f"{m} (ms)", ".2f") for m in a.model), ("ratio, last / first", ".3f")])
    for b in a.batch:
        med = [statistics.median(ms[(k, b)]) for k in range(len(llms))]
        table.row(b, *med, med[-1] / med[0])


def main() -> None:
    ap = parser(__doc__, threads=1, json_out=True)
    ap.add_argument("--model", action="append", help="checkpoint (default: the embedded demo model); give two or "
                                                      "more to compare their forwards")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 32])
    ap.add_argument("--prompt", type=int, default=96)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--requests", type=int, default=8, help="LLM.generate calls at batch 1 (one model)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (several models)")
    a = ap.parse_args()
    a.model = a.model or [None]
    torch.set_num_threads(a.threads)
    report = Report(a.json)
    (several_models if len(a.model) > 1 else one_model)(a, report)
    report.save()


if __name__ == "__main__":
    main()
