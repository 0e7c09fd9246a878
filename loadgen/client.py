"""HTTP/SSE client for OpenAI-compatible servers: one streamed request -> one RequestResult.

Owns: building ``/v1/completions`` and ``/v1/chat/completions`` bodies (text or token-id
prompts, ``stream_options.include_usage``, extra body fields), the SSE decoder (``data:`` lines,
``[DONE]``, ':' keep-alive comments, multi-line events), and timing with ``time.perf_counter``
(monotonic). Chunks whose ``choices`` is empty (usage chunk, dLLM progress chunks carrying a
``dllm`` field) never count toward TTFT or inter-chunk latency. Errors are kept with their
message: HTTP status + OpenAI ``error.message``, in-stream error events, transport exceptions.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from .workload import RequestSpec

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class StreamError(RuntimeError):
    """The server reported an error inside the stream, or sent something that is not SSE JSON."""


@dataclass
class RequestResult:
    """Timings are seconds: ``start`` relative to the run start, the rest relative to ``start``."""
    index: int
    prompt_len: int
    expected_output_len: int
    start: float = 0.0
    scheduled: float = 0.0
    ok: bool = False
    error: str = ""
    status: int | None = None
    ttft: float | None = None
    latency: float | None = None
    itls: list[float] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)   # content chunks, since start
    chunk_chars: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    usage_output_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    client_output_tokens: int = 0
    progress_chunks: int = 0
    empty_chunks: int = 0
    slo_ms: float | None = None                 # this request's latency SLO (sent as slo_ms)
    thresholds: list[float] | None = None        # per block, as the server reported them (dllm field)

    @property
    def output_tokens(self) -> int:
        """Server ``usage.completion_tokens`` when reported, else the client-side count."""
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        return self.client_output_tokens


class SSEDecoder:
    """Incremental Server-Sent-Events decoder fed one line at a time (without the newline)."""

    def __init__(self):
        self._data: list[str] = []
        self._event = ""

    def feed(self, line: str) -> tuple[str, str] | None:
        """Returns (event_name, data) when ``line`` completes an event, else None."""
        line = line.rstrip("\r")
        if line == "":
            return self.flush()
        if line.startswith(":"):
            return None                       # comment / keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> tuple[str, str] | None:
        if not self._data:
            self._event = ""
            return None
        out = (self._event, "\n".join(self._data))
        self._data, self._event = [], ""
        return out


def request_slo_ms(output_len: int, slo_ms: float | None, per_token_ms: float | None,
                   base_ms: float = 0.0) -> float | None:
    """A request's SLO: fixed, or base + a rate per requested output token."""
    if slo_ms is not None:
        return float(slo_ms)
    if per_token_ms is not None:
        return base_ms + per_token_ms * output_len
    return None


def build_body(spec: RequestSpec, endpoint: str, model: str | None, ignore_eos: bool,
               extra_body: dict | None, temperature: float | None = None, slo_ms: float | None = None) -> dict:
    body: dict = {"stream": True, "stream_options": {"include_usage": True},
                  "max_tokens": int(spec.output_len)}
    if slo_ms is not None:
        body["slo_ms"] = slo_ms
    if model:
        body["model"] = model
    if endpoint == "chat":
        if not isinstance(spec.prompt, str):
            raise ValueError("chat endpoint needs text prompts (token-id prompts: use completions)")
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    elif endpoint == "completions":
        body["prompt"] = spec.prompt
    else:
        raise ValueError(f"unknown endpoint {endpoint!r}; choose from {sorted(ENDPOINTS)}")
    if ignore_eos:
        body["ignore_eos"] = True
    if temperature is not None:
        body["temperature"] = temperature
    for key, value in (extra_body or {}).items():   # dicts merge, e.g. stream_options
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return body


def error_message(status: int, raw: bytes) -> str:
    """'HTTP <status>: <OpenAI error.message or body text>'."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = err.get("message") if isinstance(err, dict) else err
        if msg is None and isinstance(obj, dict):
            msg = obj.get("detail") or text
        text = str(msg)
    except ValueError:
        pass
    return f"HTTP {status}: {text[:500]}"


def _content(choice: dict) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or choice.get("message") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


def handle_event(res: RequestResult, event: str, data: str, t: float) -> bool:
    """Apply one SSE event received ``t`` seconds after send; returns True on ``[DONE]``."""
    if data.strip() == "[DONE]":
        return True
    try:
        obj = json.loads(data)
    except ValueError:
        raise StreamError(f"bad SSE data: {data[:200]!r}") from None
    if not isinstance(obj, dict):
        raise StreamError(f"bad SSE data: {data[:200]!r}")
    if event == "error" or (obj.get("error") and not obj.get("choices")):
        err = obj.get("error", obj)
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise StreamError(f"stream error: {msg}")
    usage = obj.get("usage")
    if usage:
        if usage.get("completion_tokens") is not None:
            res.usage_output_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            res.usage_prompt_tokens = int(usage["prompt_tokens"])
    choices = obj.get("choices")
    if not choices:
        if "dllm" in obj:
            res.progress_chunks += 1
        else:
            res.empty_chunks += 1
        return False
    choice = choices[0]
    if choice.get("finish_reason"):
        res.finish_reason = choice["finish_reason"]
    dllm = choice.get("dllm")
    if isinstance(dllm, dict) and isinstance(dllm.get("thresholds"), list):
        res.thresholds = [float(x) for x in dllm["thresholds"]]
    text = _content(choice)
    if text:
        if res.ttft is None:
            res.ttft = t
        else:
            res.itls.append(t - res.chunk_times[-1])
        res.chunk_times.append(t)
        res.chunk_chars.append(len(text))
        res.text += text
    return False


async def send_request(client: httpx.AsyncClient, base_url: str, endpoint: str, body: dict,
                       res: RequestResult, headers: dict, run_t0: float) -> RequestResult:
    """Stream one request and fill ``res``; never raises for request-level failures."""
    url = base_url.rstrip("/") + ENDPOINTS[endpoint]
    t0 = time.perf_counter()
    res.start = t0 - run_t0
    done = False
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                res.error = error_message(resp.status_code, await resp.aread())
                return res
            decoder = SSEDecoder()
            async for line in resp.aiter_lines():
                ev = decoder.feed(line)
                if ev is not None and handle_event(res, ev[0], ev[1], time.perf_counter() - t0):
                    done = True
                    break
            if not done:
                ev = decoder.flush()
                if ev is not None:
                    done = handle_event(res, ev[0], ev[1], time.perf_counter() - t0)
        res.latency = time.perf_counter() - t0
        if not done and res.finish_reason is None:
            res.error = "stream ended without [DONE] or finish_reason"
        else:
            res.ok = True
            if res.ttft is None:          # finished with no visible text (e.g. EOS at once)
                res.ttft = res.latency
    except StreamError as exc:
        res.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, none dropped
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        res.error = res.error or detail
    if not res.ok and res.latency is None:
        res.latency = time.perf_counter() - t0
    return res
