"""The OpenAPI document, generated from the pydantic request models."""
from __future__ import annotations

from .. import __version__
from .protocol import REQUEST_MODELS

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": "integer"}}}}}


def _post(model: str, summary: str, stream: bool) -> dict:
    ok = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        ok["text/event-stream"] = {"schema": {}}     # data: <chunk JSON> events, then data: [DONE]
    err = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    responses = {"200": {"description": "OK", "content": ok}}
    for code, text in (("400", "invalid request"), ("401", "bad API key"), ("404", "unknown model"),
                       ("408", "body not received in time"), ("413", "body over the size limit"),
                       ("500", "engine failure"), ("503", "overloaded, starting or draining")):
        responses[code] = {"description": text, "content": err}
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}}}, "responses": responses}}


def _get(summary: str, content_type: str = "application/json") -> dict:
    return {"get": {"summary": summary, "responses": {"200": {"description": "OK", "content": {
        content_type: {"schema": {"type": "object"} if content_type == "application/json" else {"type": "string"}}}},
        "503": {"description": "not ready"}}}}


def openapi_document(model_name: str) -> dict:
    schemas = {"Error": ERROR_SCHEMA}
    for name, model in REQUEST_MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
    return {
        "openapi": "3.1.0",
        "info": {"title": "dllm-server", "version": __version__,
                 "description": f"OpenAI-compatible API for diffusion LLMs, serving `{model_name}`"},
        "paths": {
            "/v1/chat/completions": _post("ChatCompletionRequest", "chat completion (JSON or SSE)", True),
            "/v1/completions": _post("CompletionRequest", "text completion (JSON or SSE)", True),
            "/tokenize": _post("TokenizeRequest", "tokenize a prompt or messages", False),
            "/detokenize": _post("DetokenizeRequest", "token ids to text", False),
            "/v1/models": _get("served models"),
            "/version": _get("server version"),
            "/health": {"get": {"summary": "200 when every worker is ready", "responses": {
                "200": {"description": "healthy"}, "503": {"description": "starting, unhealthy or draining"}}}},
            "/metrics": _get("Prometheus metrics", "text/plain"),
        },
        "components": {"schemas": schemas},
    }
