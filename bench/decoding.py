"""Decoding (offline engine): the three cache modes and the cost of a block step (cache), the unmasking
rules with bench/quality.py's measures (rules), and Dream's decodings under the two caches (dream).

    python -m bench.decoding [--model DIR] [--prompt-len 256] [--max-tokens 128] [--only cache,rules,dream]
"""
from __future__ import annotations

import dataclasses
import platform
import statistics
import tempfile

import torch

from bench.harness import Report, Timer, median_time_s, parser, plain_ids
from bench.quality import agreement, pseudo_log_likelihood
from dllm_server import LLM, SamplingParams
from dllm_server.checkpoint import embedded_model_path
from dllm_server.model.tiny import make_tiny_model
from dllm_server.worker.cuda_graph import DecodeGraphs
from dllm_server.worker.runner import ForwardItem, ModelRunner, fed_range

TEXTS = ["Good morrow, my lord. What news from the court?", "Now is the winter of our discontent",
         "Friends, Romans, countrymen, lend me your ears;", "What light through yonder window breaks?",
         "The quality of mercy is not strained;", "All the world's a stage, and all the men and women",
         "If music be the food of love, play on;", "Once more unto the breach, dear friends, once more;"]


def run_rule(llm: LLM, prompts: list[str], params: SamplingParams, repeats: int):
    """Each prompt alone (batch 1): the outputs, and the median over repeats of the mean latency."""
    llm.generate(prompts[0], params)   # warm-up
    outs, times = [], []
    for _ in range(repeats):
        with Timer() as t:
            outs = [llm.generate(p, params)[0] for p in prompts]
        times.append(t.s / len(prompts))
    return outs, statistics.median(times)


def quality_row(table, label: str, llm: LLM, prompts: list[str], params: SamplingParams, refs: list[list[int]],
                repeats: int) -> None:
    outs, t = run_rule(llm, prompts, params, repeats)
    fwd = statistics.mean(o.stats.num_forwards for o in outs)
    agree = statistics.mean(agreement(o.token_ids, r) for o, r in zip(outs, refs))
    pll = statistics.mean(pseudo_log_likelihood(llm, o.prompt_token_ids, o.token_ids) for o in outs)
    tpf = statistics.mean(o.tokens_per_forward for o in outs)
    table.row(label, fwd, tpf, t * 1000, agree, pll)


QUALITY_COLUMNS = [("forwards / request", ".1f"), ("tokens / forward", ".2f"), ("latency / request (ms)", ".0f"),
                   ("agreement with 0.99", ".3f"), ("pseudo log-lik", ".3f")]


def rules_table(a, report: Report) -> None:
    path = a.rules_model or str(embedded_model_path())
    base = dict(max_tokens=a.rules_max_tokens, ignore_eos=True)
    llm = LLM(path, cache="dual", block_length=a.block_length, dtype=a.dtype)
    refs = [o.token_ids for o in run_rule(llm, TEXTS, SamplingParams(threshold=0.99, **base), 1)[0]]
    print(f"rules: model={path} cache=dual block_length={a.block_length} max_tokens={a.rules_max_tokens} greedy, "
          f"{len(TEXTS)} prompts each alone, latency median of {a.repeats}; reference: threshold 0.99, same cache")
    print()
    table = report.table(["rule", *QUALITY_COLUMNS])
    quality_row(table, "threshold 0.9", llm, TEXTS, SamplingParams(threshold=0.9, **base), refs, a.repeats)
    for b in a.entropy_bounds.split(","):
        quality_row(table, f"entropy bound {float(b):g}", llm, TEXTS, SamplingParams(entropy_bound=float(b), **base),
                    refs, a.repeats)


def dream_table(a, report: Report) -> None:
    path = a.dream_model or str(make_tiny_model(tempfile.mkdtemp(), arch="dream", hidden=256, layers=4, heads=4,
                                                mlp=704, seed=0))
    base = dict(max_tokens=a.rules_max_tokens, ignore_eos=True)
    ref_llm = LLM(path, cache="none", block_length=a.block_length, dtype=a.dtype)
    refs = [o.token_ids for o in run_rule(ref_llm, TEXTS, SamplingParams(threshold=0.99, **base), 1)[0]]
    print(f"dream: model={path} block_length={a.block_length} max_tokens={a.rules_max_tokens} greedy threshold "
          f"{a.dream_threshold}, {len(TEXTS)} prompts each alone, latency median of {a.repeats}; "
          f"reference: cache none, threshold 0.99")
    print()
    table = report.table(["cache, Dream decoding", *QUALITY_COLUMNS])
    for cache in ("prefix", "dual"):
        for decoding in ("fast_dllm", "shifted"):
            llm = LLM(path, cache=cache, block_length=a.block_length, dtype=a.dtype, dream_decoding=decoding)
            quality_row(table, f"{cache}, {decoding}", llm, TEXTS, SamplingParams(threshold=a.dream_threshold, **base),
                        refs, a.repeats)


def main() -> None:
    ap = parser(__doc__, model="checkpoint folder (default: a seeded random 4-layer d=256 LLaDA)", threads=1,
                json_out=True)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--only", default="cache,rules,dream", help="tables to run: cache, rules, dream")
    ap.add_argument("--rules-model", help="checkpoint of the rules table (default: the embedded demo model)")
    ap.add_argument("--dream-model", help="Dream checkpoint (default: a seeded random 4-layer d=256 Dream)")
    ap.add_argument("--rules-max-tokens", type=int, default=64)
    ap.add_argument("--entropy-bounds", default="0.1,0.5,1,2", help="EB-sampler gammas of the rules table")
    ap.add_argument("--dream-threshold", type=float, default=0.9)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tables = args.only.split(",")
    report = Report(args.json)
    if "rules" in tables:
        rules_table(args, report)
        print()
    if "dream" in tables:
        dream_table(args, report)
        print()
    if "cache" in tables:
        cache_tables(args, report)
    report.save()


def cache_tables(args, report: Report) -> None:
    path = args.model or str(make_tiny_model(tempfile.mkdtemp(), arch="llada", hidden=256, layers=4,
                                             heads=4, mlp=704, seed=0))
    first = 1 + plain_ids(path)
    prompt = {"prompt_token_ids": [(i * 37) % 250 + first for i in range(args.prompt_len)]}
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    print(f"model={path} dtype={args.dtype} threads={args.threads} machine={platform.processor() or platform.machine()}"
          f" torch={torch.__version__}")
    print(f"prompt_len={args.prompt_len} max_tokens={args.max_tokens} block_length={args.block_length} "
          f"threshold=0.9 greedy, median of {args.repeats}")
    print()
    table = report.table(["cache", ("latency (s)", ".3f"), "forwards", ("tokens / forward", ".2f"),
                          ("output tok/s", ".1f")])
    llm = None
    for cache in ("none", "prefix", "dual"):
        llm = LLM(path, cache=cache, block_length=args.block_length, dtype=args.dtype)
        llm.generate(prompt, params)   # warm-up
        out = None

        def run():
            nonlocal out
            out = llm.generate(prompt, params)[0]
        t = median_time_s(run, args.repeats, warmup=0)
        table.row(cache, t, out.stats.num_forwards, out.tokens_per_forward, len(out.token_ids) / t)

    # One block step vs a full forward over the same canvas, batch 1 and 16.
    core = llm.core
    dev = core.pool.device
    fixed = ModelRunner(llm.runner.model, llm.args, core.pool, dev,
                        decode_graphs=DecodeGraphs(llm.runner.model, llm.args, core.pool, dev, 16,
                                                   capture=dev.type == "cuda"))
    canvas_len = args.prompt_len + args.max_tokens
    print()
    table = report.table(["batch", (f"full forward {canvas_len} tok (ms)", ".1f"), ("prefix step (ms)", ".1f"),
                          (f"dual step {args.block_length} tok (ms)", ".1f"), "full / dual",
                          ("dual step, fixed-shape path (ms)", ".1f")])
    for batch in (1, 16):
        items = {m: [] for m in ("full", "prefix", "dual")}
        for b in range(batch):
            canvas = torch.full((canvas_len,), llm.args.mask_id, dtype=torch.int64)
            canvas[: args.prompt_len] = torch.tensor(prompt["prompt_token_ids"])
            alloc = core.pool.allocate(f"bench{b}", canvas_len)
            s = args.prompt_len + args.block_length
            e = s + args.block_length
            items["full"].append(ForwardItem(canvas, alloc, 0, canvas_len, s, e))
            for m in ("prefix", "dual"):
                lo, hi = fed_range(m, False, s, e, canvas_len, llm.args.logit_shift)
                items[m].append(ForwardItem(canvas, alloc, lo, hi, s, e))
        ms = {m: 1000 * median_time_s(lambda: llm.runner.forward(items[m]), 5, warmup=0) for m in items}
        fixed.forward(items["dual"], decode_only=True)                    # builds (or captures) the shape
        ms["fixed"] = 1000 * median_time_s(lambda: fixed.forward(items["dual"], decode_only=True), 5, warmup=0)
        table.row(batch, ms["full"], ms["prefix"], ms["dual"], f"{ms['full'] / ms['dual']:.1f}x", ms["fixed"])
        for b in range(batch):
            core.pool.free(f"bench{b}")
    print()
    print("config:", {k: v for k, v in dataclasses.asdict(llm.config).items() if v is not None})


if __name__ == "__main__":
    main()
