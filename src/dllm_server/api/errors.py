"""OpenAI-style error bodies ({"error": {message, type, param, code}}) and status mapping."""
from __future__ import annotations

import re

from pydantic import ValidationError
from starlette.responses import JSONResponse

TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 408: "RequestTimeoutError",
         409: "ConflictError", 413: "BadRequestError", 500: "InternalServerError", 501: "NotImplementedError",
         503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "APIError"), "param": param, "code": status}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.status, err.message, err.param), status_code=err.status, headers=err.headers)


def _is_field(segment) -> bool:
    """Field names and list indices; not pydantic's union-branch tags ("constrained-str",
    "list[int]", "TokenizePrompt")."""
    s = str(segment)
    return isinstance(segment, int) or not (set(s) & set("-[](),") or s[:1].isupper())


def from_validation_error(exc: ValidationError) -> APIError:
    """400 naming the field; built from exc.errors(), never str(exc) (no internals leak)."""
    errors = exc.errors()
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if _is_field(p)]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    same_field = [e for e in errors if [str(p) for p in e.get("loc", ()) if _is_field(p)][:1] == loc[:1]]
    if len(same_field) > 1 and loc:     # a union: no accepted form matched
        param = loc[0]
        msg = f"does not match any accepted form (first mismatch: {msg})"
    ctx_field = re.match(r"Value error, (\w+):", msg)
    if ctx_field and not param:
        param = ctx_field.group(1)
    msg = msg.removeprefix("Value error, ")
    return APIError(400, f"{param}: {msg}" if param and not msg.startswith(param) else msg, param)


def from_value_error(exc: ValueError) -> APIError:
    """Our ValueErrors start with the field name ("max_tokens: ...", "response_format.json_schema...: ...")."""
    msg = str(exc)
    m = re.match(r"(\w+)[\w.$\[\]-]*:", msg)
    return APIError(400, msg, m.group(1) if m else None)
