"""Command line: ``python -m loadgen ...`` (flags, validation, and dispatch to one of the modes).

Owns: argparse, turning flags into ``RunConfig``/``WorkloadOptions``, the seeded generators
(workload and arrivals get independent streams of ``--seed``), and choosing between a single
rate, a ``--rates`` sweep, ``--capacity-search`` and ``--trace`` replay (see ``sweep.py``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys

from .arrivals import ARRIVAL_KINDS
from .client import ENDPOINTS
from .run import RunConfig
from .stats import parse_goodput
from .workload import DATASETS, PRESETS, WorkloadOptions

# The dataclasses are the one source of the defaults the flags show and use.
RUN, WORK = RunConfig(), WorkloadOptions()


def _rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"rate must be > 0 or inf, got {text}")
    return value


def _rates(text: str) -> list[float]:
    return [_rate(t) for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadgen",
        description="Streaming load generator for OpenAI-compatible (diffusion) LLM servers.")
    g = p.add_argument_group("server")
    g.add_argument("--base-url", default=RUN.base_url,
                   help="server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)")
    g.add_argument("--endpoint", choices=sorted(ENDPOINTS), default=RUN.endpoint)
    g.add_argument("--model", default=RUN.model, help="model name; default: first of /v1/models")
    g.add_argument("--api-key", default=RUN.api_key, help="bearer key; default: $OPENAI_API_KEY")
    g.add_argument("--extra-body", default="{}",
                   help='JSON merged into every body, e.g. \'{"threshold":0.9,"block_length":32}\'')
    g.add_argument("--ignore-eos", action="store_true", help="send ignore_eos=true")
    g.add_argument("--temperature", type=float, default=RUN.temperature)
    g.add_argument("--timeout", type=float, default=RUN.timeout_s, help="per-request timeout (s)")

    g = p.add_argument_group("workload")
    g.add_argument("--dataset", choices=DATASETS, default=WORK.dataset)
    g.add_argument("--dataset-path", default=WORK.dataset_path, help="ShareGPT-format JSON file")
    g.add_argument("--preset", choices=sorted(PRESETS), default=WORK.preset,
                   help="synthetic length preset (medians: sharegpt 795/266, arxiv 2827/162)")
    g.add_argument("--length-scale", type=float, default=WORK.length_scale,
                   help="multiply preset medians, e.g. 0.1 for a small model's context")
    g.add_argument("--spread", type=float, default=WORK.spread, help="lognormal sigma for both lengths")
    g.add_argument("--prompt-len", type=int, default=WORK.prompt_len, help="median prompt length override")
    g.add_argument("--output-len", type=int, default=WORK.output_len, help="fixed output length (max_tokens)")
    g.add_argument("--max-model-len", type=int, default=WORK.max_model_len, help="fit prompt+output into this")
    g.add_argument("--random-ids", action="store_true", help="send prompts as random token ids")
    g.add_argument("--vocab-size", type=int, default=WORK.vocab_size, help="random ids are < this")
    g.add_argument("--id-low", type=int, default=WORK.id_low, help="random ids are >= this")
    g.add_argument("--short-fraction", type=float, default=WORK.short_fraction,
                   help="arxiv-mix: share of short questions among the summaries")
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer.json or HF folder for prompt building and client-side counts")
    g.add_argument("--num-prompts", type=int, default=100)
    g.add_argument("--num-warmups", type=int, default=RUN.num_warmups, help="warm-up requests, not reported")
    g.add_argument("--seed", type=int, default=0)

    g = p.add_argument_group("arrivals")
    g.add_argument("--request-rate", type=_rate, default=math.inf, help="req/s (inf = at once)")
    g.add_argument("--rates", type=_rates, default=None, help="sweep, e.g. 1,2,4")
    g.add_argument("--arrival", choices=ARRIVAL_KINDS, default=None,
                   help="default: poisson, or gamma when --burstiness != 1")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (<1 burstier)")
    g.add_argument("--max-concurrency", type=int, default=RUN.max_concurrency, help="closed-loop cap")
    g.add_argument("--trace", default=None, help="JSONL replay: timestamp, prompt|prompt_len, "
                                                 "output_len")
    g.add_argument("--trace-speed", type=float, default=1.0, help="replay speed-up factor")

    g = p.add_argument_group("SLOs and capacity")
    g.add_argument("--slo-ms", type=float, default=RUN.slo_ms,
                   help="send every request this latency SLO (slo_ms); attainment and goodput are reported")
    g.add_argument("--slo-ms-per-token", type=float, default=RUN.slo_ms_per_token,
                   help="instead: each request's SLO is --slo-base-ms + this per requested output token")
    g.add_argument("--slo-base-ms", type=float, default=RUN.slo_base_ms)
    g.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs, e.g. --goodput ttft:1000 tpot:100 e2el:20000")
    g.add_argument("--capacity-search", action="store_true",
                   help="find the highest rate whose goodput fraction >= --capacity-target")
    g.add_argument("--capacity-target", type=float, default=0.9)
    g.add_argument("--capacity-start-rate", type=_rate, default=1.0)
    g.add_argument("--capacity-max-rate", type=_rate, default=None)
    g.add_argument("--capacity-tolerance", type=float, default=0.025)

    g = p.add_argument_group("output")
    g.add_argument("--result-dir", default="runs/loadgen")
    g.add_argument("--result-file", default=None, help="single run: exact JSON path")
    g.add_argument("--label", default=None, help="file name prefix (default dataset-endpoint)")
    g.add_argument("--metadata", nargs="*", default=[], metavar="K=V",
                   help="stored verbatim in the result file")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--no-plots", action="store_true", help="skip PNGs for sweeps/capacity")
    g.add_argument("--quiet", action="store_true", help="no tables on stdout")
    return p


def _metadata(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ValueError(f"bad --metadata item {item!r}; use KEY=VALUE")
        out[key] = val
    return out


def resolve(args: argparse.Namespace) -> tuple[RunConfig, WorkloadOptions, dict]:
    """Validate flags; returns (run config, workload options, extra settings)."""
    try:
        extra_body = json.loads(args.extra_body)
    except ValueError as exc:
        raise ValueError(f"--extra-body is not JSON: {exc}") from exc
    if not isinstance(extra_body, dict):
        raise ValueError("--extra-body must be a JSON object")
    arrival = args.arrival or ("gamma" if args.burstiness != 1.0 else "poisson")
    if arrival == "poisson" and args.burstiness != 1.0:
        raise ValueError("--burstiness needs --arrival gamma (poisson is burstiness 1)")
    if args.endpoint == "chat" and (args.random_ids or args.dataset == "random"):
        raise ValueError("token-id prompts need --endpoint completions")
    if args.slo_ms is not None and args.slo_ms_per_token is not None:
        raise ValueError("--slo-ms and --slo-ms-per-token: give one")
    if any(v is not None and v <= 0 for v in (args.slo_ms, args.slo_ms_per_token)):
        raise ValueError("SLOs must be > 0 ms")
    per_request_slo = args.slo_ms is not None or args.slo_ms_per_token is not None
    if args.capacity_search and not (args.goodput or per_request_slo):
        raise ValueError("--capacity-search needs --goodput SLOs or a per-request SLO (--slo-ms)")
    if args.num_prompts < 1 or args.num_warmups < 0:
        raise ValueError("need --num-prompts >= 1 and --num-warmups >= 0")
    cfg = RunConfig(base_url=args.base_url, endpoint=args.endpoint, model=args.model,
                    api_key=args.api_key, extra_body=extra_body, ignore_eos=args.ignore_eos,
                    temperature=args.temperature, timeout_s=args.timeout,
                    max_concurrency=args.max_concurrency, num_warmups=args.num_warmups,
                    show_progress=not args.no_progress, slos=parse_goodput(args.goodput),
                    slo_ms=args.slo_ms, slo_ms_per_token=args.slo_ms_per_token, slo_base_ms=args.slo_base_ms)
    opts = WorkloadOptions(dataset="trace" if args.trace else args.dataset,
                           dataset_path=args.dataset_path, preset=args.preset,
                           length_scale=args.length_scale, spread=args.spread,
                           prompt_len=args.prompt_len, output_len=args.output_len,
                           random_ids=args.random_ids, vocab_size=args.vocab_size,
                           id_low=args.id_low, short_fraction=args.short_fraction,
                           max_model_len=args.max_model_len)
    extra = {"arrival": arrival, "metadata": _metadata(args.metadata)}
    return cfg, opts, extra


async def amain(args: argparse.Namespace) -> dict:
    """Run the mode the flags select; returns the result (single) or a summary dict."""
    from .sweep import run_mode

    cfg, opts, extra = resolve(args)
    return await run_mode(args, cfg, opts, extra)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        asyncio.run(amain(args))
    except (ValueError, OSError) as exc:
        print(f"loadgen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
