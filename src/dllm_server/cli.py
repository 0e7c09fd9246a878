"""Command line: `dllm-server {serve,generate,make-tiny-model}`.

Flags for ServerConfig are generated from its fields (help and choices from field metadata);
unset flags are suppressed so the dataclass default is the only default. DLLM_API_KEY is the one
environment mapping and lives here.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
import typing

from .config import ServerConfig, config_fields
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
    for f in config_fields():
        if f.name in skip:
            continue
        base, optional = _field_type(f)
        flag = "--" + f.name.replace("_", "-")
        meta = f.metadata
        help_text = f"{meta.get('help', '')} (default: {f.default})"
        if base is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
        else:
            parser.add_argument(flag, type=_parse_optional(base) if optional else base,
                                choices=meta.get("choices"), default=argparse.SUPPRESS, help=help_text)


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

    from .model.tiny import make_tiny_model       # its signature is the one source of these defaults
    tiny = sub.add_parser("make-tiny-model", help="write a seeded random checkpoint in the HF layout",
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tiny.add_argument("out")
    choices = {"arch": ("llada", "dream"), "dtype": ("float32", "bfloat16", "float16")}
    for name, param in inspect.signature(make_tiny_model).parameters.items():
        if param.default is inspect.Parameter.empty:
            continue
        kind = int if name == "kv_heads" else type(param.default)
        tiny.add_argument("--" + name.replace("_", "-"), type=kind, default=param.default, choices=choices.get(name),
                          help=name.replace("_", " "))
    return p


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
    if ns.command == "serve":
        from .api.server import run_server
        return run_server(config_from_args(ns))
    return 2


if __name__ == "__main__":
    sys.exit(main())
