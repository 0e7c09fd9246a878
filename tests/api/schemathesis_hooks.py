"""Schemathesis hooks for test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS). JSON Schema
cannot relate a prompt's token count to max_tokens: the published schema states the rule in the
field's description, and this filter skips the generated bodies that break it (test_errors.py checks that such requests are 400s naming the field). Nor can it
say which schemas and regexes compile to an automaton whose shortest answer fits max_tokens: bodies asking for
structured output are skipped too (tests/structured/ sends the committed schemas and the refused kinds). Token
counts come from the server's own /tokenize, so nothing here re-implements tokenization."""
from __future__ import annotations

import os

import httpx
import schemathesis

SERVER = os.environ.get("DLLM_ST_SERVER", "")
MAX_LEN = int(os.environ.get("DLLM_ST_MAX_LEN", "0"))
BLOCK = int(os.environ.get("DLLM_ST_BLOCK", "32"))
DEFAULT_MAX = {"/v1/chat/completions": int(os.environ.get("DLLM_ST_CHAT_MAX", "128")),
               "/v1/completions": int(os.environ.get("DLLM_ST_COMPLETION_MAX", "16"))}


def _int(v) -> int | None:
    """An integer as JSON Schema (and the server) reads one: 3 or 3.0, never true."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _count(body: dict) -> int | None:
    r = httpx.post(SERVER + "/tokenize", json=body, timeout=30)
    return r.json()["count"] if r.status_code == 200 else None


def _prompt_lens(path: str, body: dict) -> list[int] | None:
    if path == "/v1/chat/completions":
        n = _count({"messages": body.get("messages")}) if isinstance(body.get("messages"), list) else None
        return None if n is None else [n]
    p = body.get("prompt")
    if isinstance(p, str):
        p = [p]
    if not isinstance(p, list) or not p:
        return None
    if all(_int(x) is not None for x in p):
        return [len(p)]
    lens = [len(x) if isinstance(x, list) else _count({"prompt": x}) if isinstance(x, str) else None for x in p]
    return None if None in lens else lens


@schemathesis.hook
def filter_body(context, body) -> bool:
    path = context.operation.path
    if path not in DEFAULT_MAX or not isinstance(body, dict):
        return True
    fmt = body.get("response_format")
    if body.get("guided_json") is not None or body.get("guided_regex") is not None or (
            isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")):
        return False
    if body.get("max_post_edit_steps") is not None and body.get("edit_threshold") is None:
        return False                  # a 400 by the field's documented rule (test_errors.py sends it)
    max_tokens = _int(body.get("max_completion_tokens")) or _int(body.get("max_tokens")) or DEFAULT_MAX[path]
    block = _int(body.get("block_length")) or BLOCK
    if max_tokens < 1 or block < 1:
        return True
    blocks = -(-max_tokens // block)
    lens = _prompt_lens(path, body)
    return lens is None or max(lens) + blocks * block <= MAX_LEN          # the documented context rule
