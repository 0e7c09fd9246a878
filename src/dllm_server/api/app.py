"""Starlette application factory: routes, auth, request ids, CORS, error handlers, OpenAPI."""
from __future__ import annotations

import hashlib
import hmac
import logging
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..engine.async_engine import AsyncEngine
from .admin import Admin
from .body import Limits
from .errors import APIError, error_body, error_response
from .metrics import Metrics
from .openapi import openapi_document, schema_limits
from .playground import Playground
from .routes import Routes

log = logging.getLogger(__name__)
PROTECTED_PREFIXES = ("/v1", "/tokenize", "/detokenize", "/reconfigure")      # /tokenizer_info too (prefix)


class RequestIdMiddleware:
    """Echo X-Request-Id (or make one); handlers read it from request.state."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = incoming if incoming and len(incoming) <= 128 and incoming.isprintable() else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((b"x-request-id", rid.encode("latin-1")))
            await send(message)
        await self.app(scope, receive, send_with_id)


class AuthMiddleware:
    """Bearer key on the API paths; /health, /metrics, /version stay open. Constant-time compare
    of SHA-256 digests, so neither the key nor its length leaks through timing."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.digest = hashlib.sha256(api_key.encode()).digest() if api_key else None

    async def __call__(self, scope, receive, send):
        if (self.digest is None or scope["type"] != "http" or scope["method"] == "OPTIONS"
                or not scope["path"].startswith(PROTECTED_PREFIXES)):
            return await self.app(scope, receive, send)
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        given = hashlib.sha256(token.strip().encode()).digest()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, self.digest):
            resp = JSONResponse(error_body(401, "invalid or missing API key"), status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
            return await resp(scope, receive, send)
        await self.app(scope, receive, send)


def build_app(engine: AsyncEngine, model_name: str, lifespan=None) -> Starlette:
    metrics = Metrics(engine, model_name)
    r = Routes(engine, model_name, metrics)
    docs: dict[bool, dict] = {}

    def openapi(request: Request) -> JSONResponse:
        """With the model's bounds once it is known (the workers report them when ready)."""
        ready = engine.is_ready
        if ready not in docs:
            info, tok = engine.model_info, engine.tokenizer
            limits = schema_limits(info.max_len, info.vocab_size, info.mask_id, tok.vocab_size if tok else None,
                                   Limits.from_config(engine.config)) if ready else None
            docs[ready] = openapi_document(model_name, limits)
        return JSONResponse(docs[ready])
    routes = [
        Route("/v1/chat/completions", r.chat_completions, methods=["POST"]),
        Route("/v1/completions", r.completions, methods=["POST"]),
        Route("/v1/models", r.models, methods=["GET"]),
        Route("/health", r.health, methods=["GET"]),
        Route("/metrics", r.metrics_endpoint, methods=["GET"]),
        Route("/version", r.version, methods=["GET"]),
        Route("/tokenize", r.tokenize, methods=["POST"]),
        Route("/detokenize", r.detokenize, methods=["POST"]),
        Route("/tokenizer_info", r.tokenizer_info, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    if engine.config.playground:
        routes += Playground(engine, model_name).routes()
    if engine.config.admin_endpoints:
        routes += Admin(engine).routes()

    def count(code: int) -> None:
        metrics.error_responses.labels(model_name, str(code)).inc()

    async def api_error(request: Request, exc: APIError):
        count(exc.status)
        return error_response(exc)

    async def http_error(request: Request, exc: HTTPException):
        count(exc.status_code)
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        count(500)
        return JSONResponse(error_body(500, "internal server error"), status_code=500)

    origins = [o.strip() for o in engine.config.allowed_origins.split(",") if o.strip()]
    middleware = [Middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"]),
                  Middleware(AuthMiddleware, api_key=engine.config.api_key),
                  Middleware(RequestIdMiddleware)]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={APIError: api_error, HTTPException: http_error, Exception: internal_error})
    app.state.metrics = metrics
    return app
