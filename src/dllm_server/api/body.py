"""Request bodies under the server's limits: read (413 past the size cap, checked as it arrives and
before any parsing; 408 when it does not arrive in time), decode (every malformed body, however
malformed, is a 400) and the count and length caps pydantic cannot know (they are config)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from .errors import APIError, from_validation_error


@dataclass(frozen=True, slots=True)
class Limits:
    body_bytes: int
    read_timeout_s: float
    messages: int
    stop_strings: int
    stop_chars: int
    prompts: int

    @classmethod
    def from_config(cls, c) -> "Limits":
        return cls(c.max_request_body_bytes, c.body_read_timeout_s, c.max_messages, c.max_stop_strings,
                   c.max_stop_chars, c.max_prompts_per_request)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than the limit of {limit} bytes")


async def read_body(request: Request, limits: Limits) -> bytes:
    """The whole body, or 413 as soon as it is known to pass the cap (a declared Content-Length
    is refused unread; the server discards what the client still sends)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.body_bytes:
        raise _too_large(limits.body_bytes)
    chunks, size = [], 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.body_bytes:
                raise _too_large(limits.body_bytes)
            chunks.append(chunk)
    try:
        await asyncio.wait_for(read(), limits.read_timeout_s)
    except asyncio.TimeoutError:
        raise APIError(408, f"request body not received within {limits.read_timeout_s:g} s") from None
    except ClientDisconnect:
        raise APIError(400, "the client closed the connection before the body was complete") from None
    return b"".join(chunks)


def parse_body(body: bytes, model: type[BaseModel]):
    """Validate the JSON body straight into `model` (one parse). Not JSON, not UTF-8, nested past
    the parser's depth limit, or not an object: 400, never a 500."""
    if body.lstrip()[:1] != b"{":
        raise APIError(400, "request body must be a JSON object")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first.get("type") in ("json_invalid", "json_type"):
            raise APIError(400, f"request body is not valid JSON ({first.get('msg', '')})") from None
        raise from_validation_error(exc) from None
    except (ValueError, RecursionError) as exc:          # never expected from pydantic; still a 400
        raise APIError(400, f"request body is not valid JSON ({type(exc).__name__})") from None


def check_limits(req, limits: Limits) -> None:
    """Counts and lengths the config caps: messages, stop strings, prompts per request."""
    messages = getattr(req, "messages", None)
    if messages is not None and len(messages) > limits.messages:
        raise APIError(400, f"messages: {len(messages)} messages; at most {limits.messages} are allowed",
                       "messages")
    stop = getattr(req, "stop", None)
    stops = [stop] if isinstance(stop, str) else stop or []
    if len(stops) > limits.stop_strings:
        raise APIError(400, f"stop: {len(stops)} stop strings; at most {limits.stop_strings} are allowed", "stop")
    longest = max(map(len, stops), default=0)
    if longest > limits.stop_chars:
        raise APIError(400, f"stop: a stop string of {longest} characters; at most {limits.stop_chars} are "
                       "allowed", "stop")
    prompt = getattr(req, "prompt", None)
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) > limits.prompts:
        raise APIError(400, f"prompt: {len(prompt)} prompts; at most {limits.prompts} per request are allowed",
                       "prompt")
