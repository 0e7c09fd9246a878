"""Run modes: one rate, a ``--rates`` sweep, ``--capacity-search``, ``--trace`` replay.

Owns: building the workload once per invocation (the same prompts at every rate), arrival
offsets per rate from an independent seeded stream, result-file naming under ``--result-dir``,
the sweep/capacity summary JSON files, and calling the plots. The search itself lives in
``capacity.py`` and one measurement in ``run.py``.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .arrivals import arrival_offsets, load_trace, trace_offsets
from .capacity import find_capacity
from .report import print_report, print_sweep, write_result
from .run import RunConfig, benchmark
from .tokens import load_counter
from .workload import WorkloadOptions, build_workload, from_trace


def rate_text(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def _echo(args, cfg: RunConfig, opts: WorkloadOptions, extra: dict, counter) -> dict:
    return {"base_url": cfg.base_url, "endpoint": cfg.endpoint, "dataset": opts.dataset,
            "dataset_path": opts.dataset_path, "preset": opts.preset,
            "length_scale": opts.length_scale, "spread": opts.spread,
            "prompt_len": opts.prompt_len, "output_len": opts.output_len,
            "max_model_len": opts.max_model_len, "random_ids": opts.random_ids,
            "vocab_size": opts.vocab_size if opts.random_ids else None,
            "num_prompts": args.num_prompts, "num_warmups": cfg.num_warmups, "seed": args.seed,
            "arrival": "trace" if args.trace else extra["arrival"],
            "burstiness": args.burstiness, "max_concurrency": cfg.max_concurrency,
            "trace": args.trace, "trace_speed": args.trace_speed if args.trace else None,
            "ignore_eos": cfg.ignore_eos, "temperature": cfg.temperature,
            "extra_body": cfg.extra_body, "tokenizer": args.tokenizer,
            "token_count_method": counter.method, "goodput_slos_ms": cfg.slos}


async def run_mode(args, cfg: RunConfig, opts: WorkloadOptions, extra: dict) -> dict:
    counter = load_counter(args.tokenizer)
    work_rng = np.random.default_rng([args.seed, 0])
    prefix = args.label or f"{opts.dataset}-{cfg.endpoint}"
    out_dir = Path(args.result_dir)
    echo = _echo(args, cfg, opts, extra, counter)
    meta = extra["metadata"]
    show = not args.quiet

    if args.trace:
        entries = load_trace(args.trace)
        specs = from_trace(entries, work_rng, counter, opts)
        echo.update(num_prompts=len(specs), request_rate="trace")
        result = await benchmark(cfg, specs, trace_offsets(entries, args.trace_speed), counter,
                                 specs[: cfg.num_warmups], echo, meta, "trace replay")
        path = write_result(result, args.result_file or out_dir / f"{prefix}-trace.json")
        if show:
            print_report(result)
            print(f"result: {path}")
        return result

    n, nw = args.num_prompts, cfg.num_warmups
    everything = build_workload(n + nw, work_rng, counter, opts)
    warm, specs = everything[:nw], everything[nw:]

    async def measure(rate: float, tag: str, path: str | None = None) -> dict:
        arr_rng = np.random.default_rng([args.seed, 1])
        offsets = arrival_offsets(extra["arrival"], rate, n, arr_rng, args.burstiness)
        result = await benchmark(cfg, specs, offsets, counter, warm,
                                 {**echo, "request_rate": rate_text(rate)}, meta,
                                 f"{rate_text(rate)} req/s")
        path = path or out_dir / f"{prefix}-{tag}rate{rate_text(rate)}.json"
        result["result_file"] = str(write_result(result, path))
        if show:
            print_report(result)
            print(f"result: {result['result_file']}")
        return result

    if args.capacity_search:
        return await _capacity(args, cfg, measure, out_dir, prefix, show)
    if args.rates:
        results = [await measure(rate, "") for rate in args.rates]
        summary = {"mode": "sweep", "runs": [
            {"rate": r["config"]["request_rate"], "file": r["result_file"],
             "summary": r["summary"]} for r in results]}
        summary["plots"] = _plots(args, results, out_dir, prefix)
        write_result(summary, out_dir / f"{prefix}-sweep.json")
        if show:
            print_sweep(results)
            print(f"sweep: {out_dir / f'{prefix}-sweep.json'} plots: {summary['plots']}")
        return summary
    return await measure(args.request_rate, "", args.result_file)


def _plots(args, results: list[dict], out_dir: Path, prefix: str) -> list[str]:
    if args.no_plots:
        return []
    from .plots import plot_latency_cdf, plot_latency_vs_rate

    finite = [r for r in results if r["config"]["request_rate"] != "inf"]
    paths = []
    if finite:
        paths.append(str(plot_latency_vs_rate(finite, out_dir / f"{prefix}-latency-vs-rate.png",
                                              prefix)))
    paths.append(str(plot_latency_cdf(results, out_dir / f"{prefix}-latency-cdf.png", prefix)))
    return paths


async def _capacity(args, cfg: RunConfig, measure, out_dir: Path, prefix: str,
                    show: bool) -> dict:
    target = args.capacity_target

    def slo_check(result: dict) -> bool:
        return result["summary"]["goodput"]["fraction"] >= target

    found = await find_capacity(lambda rate: measure(rate, "capacity-"), slo_check,
                                start_rate=args.capacity_start_rate,
                                tolerance=args.capacity_tolerance,
                                max_rate=args.capacity_max_rate)
    results = [h["result"] for h in found["history"]]
    summary = {"mode": "capacity", "slos_ms": cfg.slos, "target_fraction": target,
               **{k: found[k] for k in ("capacity", "lower", "upper", "bracketed", "converged",
                                        "tolerance")},
               "history": [{"rate": h["rate"], "ok": h["ok"], "file": h["result"]["result_file"],
                            "goodput_fraction": h["result"]["summary"]["goodput"]["fraction"],
                            "summary": h["result"]["summary"]} for h in found["history"]]}
    summary["plots"] = _plots(args, results, out_dir, f"{prefix}-capacity")
    path = write_result(summary, out_dir / f"{prefix}-capacity.json")
    if show:
        print_sweep(results)
        cap = found["capacity"]
        print(f"capacity: {'none found' if cap is None else f'{cap:.3f} req/s'} "
              f"(bracket {found['lower']} .. {found['upper']}, {len(results)} runs) -> {path}")
    return summary
