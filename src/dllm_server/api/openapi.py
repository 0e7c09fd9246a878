"""The OpenAPI document, generated from the pydantic request models, with the served model's own
bounds (context, vocabulary, mask id) filled in once the workers have reported them: a request the
schema allows is one the server accepts, except for the cross-field rule the fields' descriptions
state (the prompt's token count plus max_tokens against the context)."""
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


def schema_limits(max_len: int, vocab_size: int, mask_id: int, tokenizer_vocab: int | None,
                  request=None) -> dict:
    """The keywords each `x-dllm-bound` marker of the request models becomes for one model, and for
    the server's request limits (`request`: api.body.Limits; the 400s check_limits gives)."""
    limits = {"max_tokens": {"maximum": max_len - 1},      # a 1-token prompt, blocks of 1
              "prompt_token": {"maximum": vocab_size - 1, "not": {"const": mask_id}}}
    if tokenizer_vocab is not None:
        limits["token"] = {"maximum": tokenizer_vocab - 1}
    if request is not None:
        limits["stop"] = {"array": {"maxItems": request.stop_strings}, "string": {"maxLength": request.stop_chars}}
        limits["messages"] = {"array": {"maxItems": request.messages}}
    return limits


_JSON_TYPES = {"array", "string", "integer", "number", "boolean", "object"}


def _apply_bounds(node, limits: dict) -> None:
    if isinstance(node, dict):
        kind = node.pop("x-dllm-bound", None)
        if kind in limits and set(limits[kind]) <= _JSON_TYPES:     # keywords per JSON type: every branch and item
            _by_type(node, limits[kind])
        elif kind in limits:     # on the integer branch of an optional field, so generators see it there
            ints = [b for b in node.get("anyOf", []) if b.get("type") == "integer"]
            for target in ints or [node]:
                target.update(limits[kind])
        for value in node.values():
            _apply_bounds(value, limits)
    elif isinstance(node, list):
        for value in node:
            _apply_bounds(value, limits)


def _by_type(node: dict, keywords: dict) -> None:
    """`keywords[t]` onto every branch of JSON type t: the node, its anyOf branches, array items."""
    for branch in node.get("anyOf", [node]):
        branch.update(keywords.get(branch.get("type"), {}))
        items = branch.get("items")
        if isinstance(items, dict) and "type" in items:
            items.update(keywords.get(items["type"], {}))


def openapi_document(model_name: str, limits: dict | None = None) -> dict:
    """`limits` from schema_limits (None before the workers are ready: the model-free bounds only)."""
    schemas = {"Error": ERROR_SCHEMA}
    for name, model in REQUEST_MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
    _apply_bounds(schemas, limits or {})
    return {
        "openapi": "3.1.0",
        "info": {"title": "dllm-server", "version": __version__,
                 "description": f"OpenAI-compatible API for diffusion LLMs, serving `{model_name}`"},
        "paths": {
            "/v1/chat/completions": _post("ChatCompletionRequest", "chat completion (JSON or SSE)", True),
            "/v1/completions": _post("CompletionRequest", "text completion (JSON or SSE)", True),
            "/tokenize": _post("TokenizeRequest", "tokenize a prompt or messages", False),
            "/detokenize": _post("DetokenizeRequest", "token ids to text", False),
            "/tokenizer_info": _get("the tokenizer's special tokens and chat template (as vLLM's route)"),
            "/v1/models": _get("served models"),
            "/version": _get("server version"),
            "/health": {"get": {"summary": "200 when every worker is ready", "responses": {
                "200": {"description": "healthy"}, "503": {"description": "starting, unhealthy or draining"}}}},
            "/metrics": _get("Prometheus metrics", "text/plain"),
        },
        "components": {"schemas": schemas},
    }
