"""Command line: `dllm-server {serve,generate,make-tiny-model,calibrate,plan}`.

Flags for ServerConfig are generated from its fields (help and choices from field metadata);
unset flags are suppressed so the dataclass default is the only default. The environment mappings
live here: DLLM_API_KEY, and DLLM_TEST_HOOKS (the test suite's fault injection, config.TestHooks).
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
import typing

from .config import SECTIONS, ServerConfig, TestHooks, config_fields
from .decoding.params import SamplingParams


GENERATE_FIELDS = (("max_tokens", int), ("temperature", float), ("top_p", float), ("top_k", int),
                   ("min_p", float), ("steps", int))


def _field_type(f: dataclasses.Field):
    hint = typing.get_type_hints(ServerConfig)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    optional = type(None) in typing.get_args(hint)
    return base, optional


def _parse_optional(base):
    def parse(text: str):
        if text.lower() in ("none", "inf", "infinity", "unlimited"):
            return None
        return base(text)
    parse.__name__ = base.__name__
    return parse


def add_config_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ("model",)) -> None:
    """One flag per ServerConfig field, in an argument group per config section."""
    for section in SECTIONS:
        group = parser.add_argument_group(f"{section.SECTION} options", section.__doc__)
        for f in dataclasses.fields(section):
            if f.name in skip:
                continue
            base, optional = _field_type(f)
            flag = "--" + f.name.replace("_", "-")
            help_text = f"{f.metadata.get('help', '')} (default: {f.default})"
            if base is bool:
                group.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                   help=help_text)
            else:
                group.add_argument(flag, type=_parse_optional(base) if optional else base,
                                   choices=f.metadata.get("choices"), default=argparse.SUPPRESS, help=help_text)


def config_from_args(ns: argparse.Namespace) -> ServerConfig:
    names = {f.name for f in config_fields()}
    values = {k: v for k, v in vars(ns).items() if k in names}
    if "api_key" not in values and os.environ.get("DLLM_API_KEY"):
        values["api_key"] = os.environ["DLLM_API_KEY"]
    return ServerConfig(**values)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dllm-server", description="Serving for diffusion LLMs (LLaDA, Dream)")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("model", nargs="?", default=argparse.SUPPRESS,
                       help="HF checkpoint folder or Hugging Face model id ORG/NAME (default: the embedded demo model)")
    add_config_flags(serve)

    gen = sub.add_parser("generate", help="offline generation for a few prompts")
    gen.add_argument("model", nargs="?", default=argparse.SUPPRESS,
                     help="HF checkpoint folder or Hugging Face model id ORG/NAME")
    gen.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable)")
    gen.add_argument("--chat", action="store_true", help="apply the chat template")
    sampling = SamplingParams()
    for name, kind in GENERATE_FIELDS:
        gen.add_argument("--" + name.replace("_", "-"), type=kind, default=argparse.SUPPRESS,
                         help=f"request sampling field (default: {getattr(sampling, name)})")
    gen.add_argument("--seed", dest="request_seed", type=int, default=argparse.SUPPRESS,
                     help="request seed (default: derived from the server seed and arrival order)")
    add_config_flags(gen, skip=("model", "seed"))

    add_sim_parsers(sub)

    from .model.tiny import make_tiny_model       # its signature is the one source of these defaults
    tiny = sub.add_parser("make-tiny-model", help="write a seeded random checkpoint in the HF layout",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tiny.add_argument("out")
    choices = {"arch": ("llada", "dream", "sdar", "llada2"), "dtype": ("float32", "bfloat16", "float16")}
    for name, param in inspect.signature(make_tiny_model).parameters.items():
        if param.default is inspect.Parameter.empty:
            continue
        kind = int if name == "kv_heads" else type(param.default)
        tiny.add_argument("--" + name.replace("_", "-"), type=kind, default=param.default, choices=choices.get(name),
                          help=name.replace("_", " "))
    return p


def add_sim_parsers(sub) -> None:
    """`calibrate` (fit the simulator's CPU cost model to this machine) and `plan` (docs/simulation.md)."""
    cal = sub.add_parser("calibrate", help="run the real engine briefly and fit the simulator's CPU cost model",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cal.add_argument("--model", default=None, help="checkpoint (default: the embedded demo model)")
    cal.add_argument("--out", default="sim_cpu.json", help="calibration file to write")
    cal.add_argument("--workers", default="1,2", help="worker-process counts to fit (they share the cores)")
    cal.add_argument("--seed", type=int, default=0)
    plan = sub.add_parser("plan", help="simulate candidate configurations and rank them by capacity at an SLO",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    plan.add_argument("--model", default="llada-8b", choices=("llada-8b", "dream-7b", "llada2-mini"))
    plan.add_argument("--device", default="h100", choices=("h100", "h200", "cpu"),
                      help="device profile (cpu: needs --calibration)")
    plan.add_argument("--gpu-bench", help="a bench/gpu.py JSON: fit the GPU cost model to that measured run")
    plan.add_argument("--calibration", help="the file `dllm-server calibrate` wrote (device cpu)")
    plan.add_argument("--link", default="nvlink", help="KV link: nvlink, pcie5, net-25g, net-100g, net-200g, net-400g")
    plan.add_argument("--workers", type=int, default=8, help="GPUs (workers) to place")
    plan.add_argument("--workload", default="sharegpt", choices=("sharegpt", "arxiv"), help="loadgen preset")
    plan.add_argument("--trace", help="a loadgen replay trace (JSONL) instead of a preset")
    plan.add_argument("--replay", help="trace folder or file of our engine (trace mode): replay its forwards")
    plan.add_argument("--requests", type=int, default=400, help="requests per simulated probe")
    plan.add_argument("--max-tokens", type=int, help="every request asks this many, its answer ends at an EOS "
                      "(default: each asks exactly its output length, ignore_eos)")
    plan.add_argument("--threshold", type=float, default=0.9)
    plan.add_argument("--block-length", type=int, default=32)
    plan.add_argument("--slo-metric", default="p99", choices=("mean", "p50", "p90", "p99"))
    plan.add_argument("--slo-s", type=float, default=20.0, help="end-to-end latency bound")
    plan.add_argument("--taus", default="256,1024,4096,inf", help="token budgets of the colocated candidates")
    plan.add_argument("--theta", type=int, default=8192, help="overflow threshold of the hybrid candidates")
    plan.add_argument("--tensor-parallel", default="1", help="tensor-parallel degrees, comma-separated (e.g. 1,2,4): "
                      "adds colocated N x TPd candidates (N = workers // d) at each tau for every d > 1 dividing the "
                      "model's heads, each instance simulated with the roofline at degree d")
    plan.add_argument("--start-rate", type=float, default=1.0)
    plan.add_argument("--tolerance", type=float, default=0.05, help="capacity bracket, relative")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--jobs", type=int, default=1, help="simulate candidates in this many processes")
    plan.add_argument("--json", action="store_true", help="print JSON instead of the table")
    plan.add_argument("--plot", help="write a bar chart of the capacities here")
    plan.add_argument("--no-progress", action="store_true")


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return _run(ns)
    except ValueError as exc:      # bad flags or a bad model folder: one clear line, no traceback
        print(f"dllm-server: error: {exc}", file=sys.stderr)
        return 2


def _run(ns: argparse.Namespace) -> int:
    if ns.command == "make-tiny-model":
        from .model.tiny import make_tiny_model
        names = set(inspect.signature(make_tiny_model).parameters) - {"out"}
        print(make_tiny_model(ns.out, **{k: v for k, v in vars(ns).items() if k in names}))
        return 0
    if ns.command == "generate":
        from . import LLM
        config = config_from_args(ns)
        llm = LLM(**dataclasses.asdict(config))
        given = {k: getattr(ns, k) for k, _ in GENERATE_FIELDS if hasattr(ns, k)}
        params = SamplingParams(**{**llm.sampling_defaults, **given, "seed": getattr(ns, "request_seed", None)})
        if ns.chat:
            outs = llm.chat([[{"role": "user", "content": p}] for p in ns.prompt], params)
        else:
            outs = llm.generate(ns.prompt, params)
        for o in outs:
            print(json.dumps({"text": o.text, "finish_reason": o.finish_reason, "num_tokens": len(o.token_ids),
                              "forwards": o.stats.num_forwards,
                              "tokens_per_forward": round(o.tokens_per_forward, 3)}))
        return 0
    if ns.command == "calibrate":
        from .sim.calibrate import write_calibration
        data = write_calibration(ns.out, ns.model, tuple(int(w) for w in ns.workers.split(",")), ns.seed)
        print(json.dumps({k: data[k] for k in ("message_latency_s", "link_bytes_per_s")} |
                         {"fits": {w: {k: {m: v[m] for m in ("samples", "turn_left_out", "turn_mean_abs_rel_error")}
                                       for k, v in d["fits"].items()} for w, d in data["by_workers"].items()},
                          "out": ns.out}, indent=1))
        return 0
    if ns.command == "plan":
        from .sizing import run_plan
        return run_plan(ns)
    if ns.command == "serve":
        from .api.server import run_server
        return run_server(config_from_args(ns), TestHooks.parse(os.environ.get("DLLM_TEST_HOOKS", "")))
    return 2


if __name__ == "__main__":
    sys.exit(main())
