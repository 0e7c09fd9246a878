"""Command line: `dllm-server {serve,generate,make-tiny-model}`.

Flags for ServerConfig are generated from its fields (help and choices from field metadata);
unset flags are suppressed so the dataclass default is the only default. DLLM_API_KEY is the one
environment mapping and lives here.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing

from .config import ServerConfig, config_fields


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
                       help="HF checkpoint folder (default: the embedded demo model)")
    add_config_flags(serve)

    gen = sub.add_parser("generate", help="offline generation for a few prompts")
    gen.add_argument("model", nargs="?", default=argparse.SUPPRESS, help="HF checkpoint folder")
    gen.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable)")
    gen.add_argument("--chat", action="store_true", help="apply the chat template")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", dest="request_seed", type=int, default=None)
    add_config_flags(gen, skip=("model", "seed"))

    tiny = sub.add_parser("make-tiny-model", help="write a seeded random checkpoint in the HF layout")
    tiny.add_argument("out")
    tiny.add_argument("--arch", choices=("llada", "dream"), default="llada")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--hidden", type=int, default=64)
    tiny.add_argument("--layers", type=int, default=2)
    tiny.add_argument("--heads", type=int, default=4)
    tiny.add_argument("--kv-heads", type=int, default=None)
    tiny.add_argument("--mlp", type=int, default=128)
    tiny.add_argument("--max-len", type=int, default=1024)
    tiny.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    tiny.add_argument("--shards", type=int, default=1)
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
        out = make_tiny_model(ns.out, arch=ns.arch, seed=ns.seed, hidden=ns.hidden, layers=ns.layers,
                              heads=ns.heads, kv_heads=ns.kv_heads, mlp=ns.mlp, max_len=ns.max_len,
                              dtype=ns.dtype, shards=ns.shards)
        print(out)
        return 0
    if ns.command == "generate":
        from . import LLM, SamplingParams
        config = config_from_args(ns)
        llm = LLM(**dataclasses.asdict(config))
        params = SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature, seed=ns.request_seed)
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
