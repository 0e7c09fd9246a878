"""OpenAI request fields this server does not implement. Each accepts only its no-op values
(absent, null, false, [], {"type": "text"}, ...), the OpenAPI schema states exactly those, and any
other value is a 400 naming the field: never silently ignored. Fields OpenAI does not define keep
vLLM's log-and-ignore rule (protocol.OpenAIModel)."""
from __future__ import annotations

from typing import Annotated, Any, Callable

from pydantic import AfterValidator, WithJsonSchema

NULL = {"type": "null"}


def only(schemas: list[dict], accepts: Callable[[Any], bool], why: str, description: str):
    """A field that takes null or a value `accepts` allows (stated by `schemas`); else a 400."""
    def check(value):
        if value is not None and not accepts(value):
            raise ValueError(f"not supported: {why}")
        return value
    schema = {"anyOf": [*schemas, NULL]} if schemas else dict(NULL)
    return Annotated[Any, WithJsonSchema({**schema, "description": description}), AfterValidator(check)]


def _empty(kind: type):
    return lambda v: isinstance(v, kind) and not v


def _same(v, x) -> bool:
    """JSON equality: true is not 1, but 1.0 is 1 (JSON Schema's const compares numbers by value)."""
    if isinstance(x, bool) or isinstance(v, bool):
        return v is x
    if isinstance(x, int):
        return isinstance(v, (int, float)) and v == x
    return type(v) is type(x) and v == x


def _is(*values):
    return lambda v: any(_same(v, x) for x in values)


NO_TOOLS = "this server does no tool or function calling"
EMPTY_LIST, EMPTY_OBJECT = {"type": "array", "maxItems": 0}, {"type": "object", "maxProperties": 0}

Tools = only([EMPTY_LIST], _empty(list), NO_TOOLS, "only [] (no tool calling)")
ToolChoice = only([{"const": "none"}], _is("none"), NO_TOOLS, 'only "none" (no tool calling)')
ParallelToolCalls = only([{"type": "boolean"}], lambda v: isinstance(v, bool), NO_TOOLS,
                         "accepted: without tools it changes nothing")
Functions = only([EMPTY_LIST], _empty(list), NO_TOOLS, "deprecated; only [] (no function calling)")
FunctionCall = only([{"const": "none"}], _is("none"), NO_TOOLS, 'deprecated; only "none"')
LogitBias = only([EMPTY_OBJECT], _empty(dict), "no logit bias", "only {} (not supported)")
Modalities = only([{"type": "array", "items": {"const": "text"}, "minItems": 1, "maxItems": 1}],
                  lambda v: v == ["text"], "text output only", 'only ["text"]')
Audio = only([], _is(), "no audio output", "only null (no audio)")
Prediction = only([], _is(), "no predicted outputs", "only null (not supported)")
ReasoningEffort = only([], _is(), "not a reasoning model", "only null (not supported)")
WebSearch = only([], _is(), "no web search", "only null (not supported)")
Verbosity = only([], _is(), "not supported", "only null (not supported)")
Store = only([{"const": False}], _is(False), "completions are not stored", "only false (nothing is stored)")
Metadata = only([EMPTY_OBJECT], _empty(dict), "completions are not stored (metadata tags stored ones)",
                "only {} (nothing is stored)")
ServiceTier = only([{"enum": ["auto", "default"]}], _is("auto", "default"), "one service tier",
                   'only "auto" or "default"')
IncludeObfuscation = only([{"const": False}], _is(False), "no stream obfuscation", "only false (not supported)")
# completions
Echo = only([{"const": False}], _is(False), "the prompt is not echoed: its log-probabilities would be a masked "
            "diffusion model's likelihood, an estimate over many samples, not one forward (docs/evaluation.md)",
            "only false")
BestOf = only([{"const": 1}], _is(1), "no ranking of samples by likelihood; use n", "only 1 (use n for samples)")
Suffix = only([{"const": ""}], _is(""), "no infilling after a suffix", 'only "" (no suffix)')
