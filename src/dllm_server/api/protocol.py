"""Pydantic models of the OpenAI wire format (as vLLM accepts it) plus our diffusion extras,
and their conversion to SamplingParams. No I/O here."""
from __future__ import annotations

import logging
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, RootModel, StrictBool, StringConstraints,
                      model_validator)

from ..decoding.params import MAX_LOGPROBS, MAX_POST_EDIT_STEPS, MAX_SEED, SamplingParams, StructuredOutputs
from . import openai_fields as of

log = logging.getLogger(__name__)
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]


def _whole(value):
    """JSON Schema's integer includes 2.0 (and JavaScript clients send it): an integral float is
    taken as its int; 2.5, true and "2" stay errors (the models are strict)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def integer(**bounds):
    """An integer field's type: the bounds on the int itself (so the schema states them), then
    the integral-float rule around it."""
    return Annotated[int, Field(**bounds), BeforeValidator(_whole)]


class OpenAIModel(BaseModel):
    # Unknown fields are accepted, logged and ignored (vLLM's behaviour). Strict: JSON `false`
    # is not a number and "yes" is not a boolean.
    model_config = ConfigDict(extra="allow", strict=True)

    def ignored_fields(self) -> list[str]:
        return sorted((self.model_extra or {}).keys())


class StreamOptions(OpenAIModel):
    include_usage: StrictBool = False
    include_progress: StrictBool = Field(False, description="dllm: stream denoising progress chunks (choices: [])")
    include_obfuscation: of.IncludeObfuscation = None


# The cross-field rules JSON Schema can state (the others are in the fields' descriptions).
CONDITIONS = [
    {"if": {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]},
     "then": {"properties": {"stream": {"const": True}}, "required": ["stream"]}},
    {"if": {"properties": {"remasking": {"const": "random"}}, "required": ["remasking"]},
     "then": {"properties": {"steps": {"type": "integer"}}, "required": ["steps"]}},
    {"not": {"properties": {"factor": {"type": "number"}, "steps": {"type": "integer"}},
             "required": ["factor", "steps"]}},
    {"not": {"properties": {"entropy_bound": {"type": "number"}, "factor": {"type": "number"}},
             "required": ["entropy_bound", "factor"]}},
    {"not": {"properties": {"entropy_bound": {"type": "number"}, "steps": {"type": "integer"}},
             "required": ["entropy_bound", "steps"]}},
]
MAX_N = 128      # OpenAI's limit
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "threshold", "factor", "steps", "seed", "block_length",
                   "slo_ms", "entropy_bound", "edit_threshold", "max_post_edit_steps")      # passed to SamplingParams as given; None: the default
CONTEXT_RULE = ("prompt tokens + max_tokens rounded up to whole blocks (block_length) must fit the model's "
                "context (max_model_len of /v1/models), else 400 naming max_tokens")


class JSONSchemaFormat(OpenAIModel):
    name: str = Field(..., pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema", description="a JSON Schema; absent: any JSON object")
    strict: StrictBool | None = Field(None, description="accepted; the schema is always enforced exactly, or the "
                                      "request is refused with the keyword it cannot enforce")
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


class ResponseFormat(OpenAIModel):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={"allOf": [
        {"if": {"properties": {"type": {"const": "json_schema"}}},
         "then": {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}},
         "else": {"properties": {"json_schema": {"type": "null"}}}}]})
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _checks(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError('response_format: json_schema is given exactly when type is "json_schema"')
        return self


STRUCTURED_DOC = ("docs/structured_output.md: the answer is decoded to match (JSON Schema keywords it cannot "
                  "enforce exactly are a 400)")


class DiffusionFields(OpenAIModel):
    """Sampling fields shared by chat and completions, plus the diffusion extras."""
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={"allOf": CONDITIONS})

    model: str | None = None
    max_tokens: integer(ge=1) | None = Field(None, description=CONTEXT_RULE,
                                   json_schema_extra={"x-dllm-bound": "max_tokens"})
    max_completion_tokens: integer(ge=1) | None = Field(None, description="wins over max_tokens; " + CONTEXT_RULE,
                                              json_schema_extra={"x-dllm-bound": "max_tokens"})
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: integer(ge=-1) | None = Field(None, description="sample among the k most likely tokens; 0 or -1: all")
    min_p: float | None = Field(None, ge=0, le=1, description="drop tokens below min_p x the top token's probability")
    seed: integer(ge=0, le=MAX_SEED) | None = None
    stop: Union[NonEmptyStr, list[NonEmptyStr], None] = Field(None, description="a stop string or a list; their "
                                                              "number and length are capped by the server's limits",
                                                              json_schema_extra={"x-dllm-bound": "stop"})
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: integer(ge=1, le=MAX_N) = Field(1, description="independent samples of each prompt: sample i uses seed + i "
                   "(mod 2**63), so it equals the n=1 request with that seed")
    user: str | None = None
    ignore_eos: StrictBool = False
    presence_penalty: float | None = Field(None, ge=0, le=0, description="only 0 (not supported)")
    frequency_penalty: float | None = Field(None, ge=0, le=0, description="only 0 (not supported)")
    logit_bias: of.LogitBias = None
    # diffusion extras
    block_length: integer(ge=1, le=256) | None = None
    threshold: float | None = Field(None, ge=0, le=1)
    factor: float | None = Field(None, gt=0, le=1e6, description="not with steps")
    steps: integer(ge=1, le=1_000_000) | None = Field(None, description="forwards over the whole answer (LLaDA), "
                              "split over the blocks; taken as at least one per block and at most one per answer "
                              "position (max_tokens rounded up to whole blocks); not with factor")
    entropy_bound: float | None = Field(None, ge=0, le=1e6, description="dllm: the EB-sampler rule: commit, by "
                                        "confidence, the most masked positions whose entropies summed less their "
                                        "largest stay <= this; not with factor or steps")
    edit_threshold: float | None = Field(None, gt=0, le=1, description="dllm: LLaDA2.1's token editing (SGLang's "
                                         "name; diffusers: editing_threshold): a filled position of the current "
                                         "block whose proposal differs with confidence >= this is rewritten; text is "
                                         "streamed only when its block is final; not with response_format")
    max_post_edit_steps: integer(ge=0, le=MAX_POST_EDIT_STEPS) | None = Field(None, description="dllm: needs edit_threshold; the "
                                         "forwards a block may spend editing after its masks are filled (diffusers: "
                                         "max_post_steps; default 16)")
    remasking: Literal["low_confidence", "random"] = Field(SamplingParams().remasking, description="random needs steps")
    slo_ms: float | None = Field(None, gt=0, le=86_400_000, description="dllm: end-to-end latency target (ms) from "
                                 "arrival; with --threshold-policy slo each block's threshold is chosen to meet it")
    return_token_ids: StrictBool = False
    response_format: ResponseFormat | None = Field(None, description=STRUCTURED_DOC)
    guided_json: Union[dict, str, None] = Field(None, description="vLLM's extra: a JSON schema; " + STRUCTURED_DOC)
    guided_regex: str | None = Field(None, description="vLLM's extra: a regular expression the answer matches")

    @model_validator(mode="after")
    def _checks(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream=true")
        given = [n for n, v in (("response_format", self.response_format is not None
                                 and self.response_format.type != "text"),
                                ("guided_json", self.guided_json is not None),
                                ("guided_regex", self.guided_regex is not None)) if v]
        if len(given) > 1:
            raise ValueError(f"{given[1]}: give one of response_format, guided_json, guided_regex")
        return self

    @property
    def structured_outputs(self) -> StructuredOutputs | None:
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            return StructuredOutputs(json_object=True)
        if rf is not None and rf.type == "json_schema":
            s = rf.json_schema.schema_
            return StructuredOutputs(json_object=True) if s is None else \
                StructuredOutputs(json=s, field="response_format.json_schema.schema")
        if self.guided_json is not None:
            return StructuredOutputs(json=self.guided_json, field="guided_json")
        if self.guided_regex is not None:
            return StructuredOutputs(regex=self.guided_regex, field="guided_regex")
        return None

    def sampling_params(self, default_max_tokens: int, defaults: dict | None = None) -> SamplingParams:
        """Only the fields the request gave, over `defaults` (the model's generation config);
        SamplingParams holds every other default."""
        defaults = dict(defaults or {})
        max_tokens = self.max_completion_tokens or self.max_tokens or defaults.pop("max_tokens", default_max_tokens)
        defaults.pop("max_tokens", None)
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        given = {k: getattr(self, k) for k in SAMPLING_FIELDS if getattr(self, k) is not None}
        return SamplingParams(max_tokens=max_tokens, remasking=self.remasking, ignore_eos=self.ignore_eos,
                              stop=tuple(stop) if stop else None, logprobs=self.logprobs_asked,
                              structured_outputs=self.structured_outputs, **{**defaults, **given})

    @property
    def logprobs_asked(self) -> int | None:
        """Alternatives per token when log-probabilities are asked for, else None."""
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def include_progress(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_progress)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    role: Literal["system", "user", "assistant", "developer"]
    content: Union[str, list[TextPart]]
    name: str | None = None

    def as_template_message(self) -> dict[str, Any]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(DiffusionFields):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={"allOf": CONDITIONS + [
        {"if": {"properties": {"top_logprobs": {"type": "integer", "minimum": 1}}, "required": ["top_logprobs"]},
         "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}}]})
    messages: list[ChatMessage] = Field(..., min_length=1, json_schema_extra={"x-dllm-bound": "messages"})
    logprobs: StrictBool | None = Field(None, description="dllm: each answer token's log-probability under the forward that committed it (the model's own distribution at that denoising step: a diffusion model commits out of order, so this is not a left-to-right likelihood; docs/evaluation.md)")
    top_logprobs: integer(ge=0, le=MAX_LOGPROBS) | None = Field(None, description="alternatives per token, with "
                                                                 "logprobs true (each from the same forward)")
    tools: of.Tools = None
    tool_choice: of.ToolChoice = None
    parallel_tool_calls: of.ParallelToolCalls = None
    functions: of.Functions = None
    function_call: of.FunctionCall = None
    modalities: of.Modalities = None
    audio: of.Audio = None
    prediction: of.Prediction = None
    reasoning_effort: of.ReasoningEffort = None
    web_search_options: of.WebSearch = None
    verbosity: of.Verbosity = None
    store: of.Store = None
    metadata: of.Metadata = None
    service_tier: of.ServiceTier = None
    prompt_cache_key: str | None = Field(None, description="accepted: a cache hint that changes no output")
    safety_identifier: str | None = Field(None, description="accepted, like user")

    @model_validator(mode="after")
    def _logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        return self

    @property
    def logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


TokenId = Annotated[integer(ge=0), Field(json_schema_extra={"x-dllm-bound": "prompt_token"})]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class CompletionRequest(DiffusionFields):
    prompt: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Field(min_length=1)], TokenIds,
                  Annotated[list[TokenIds], Field(min_length=1)]]
    echo: of.Echo = None
    logprobs: integer(ge=0, le=MAX_LOGPROBS) | None = Field(None, description="dllm: each answer token's log-probability under the forward that committed it (the model's own distribution at that denoising step: a diffusion model commits out of order, so this is not a left-to-right likelihood; docs/evaluation.md); this many alternatives per "
                                                             "token (prompt log-probabilities with echo: no)")
    best_of: of.BestOf = None
    suffix: of.Suffix = None

    @property
    def logprobs_asked(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[Any]:
        """Each prompt as the engine takes it: a string or {"prompt_token_ids": [...]}."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(isinstance(x, int) for x in p):
            return [{"prompt_token_ids": list(p)}]
        return [{"prompt_token_ids": list(x)} for x in p]


class TokenizePrompt(OpenAIModel):
    model: str | None = None
    prompt: str
    add_special_tokens: StrictBool = Field(True, description="as vLLM: add the tokenizer's BOS and the like")


class TokenizeMessages(OpenAIModel):
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1, json_schema_extra={"x-dllm-bound": "messages"})


class TokenizeRequest(RootModel[Union[TokenizePrompt, TokenizeMessages]]):
    """Either {"prompt": ...} or {"messages": [...]}."""

    @property
    def model(self) -> str | None:
        return self.root.model

    def ignored_fields(self) -> list[str]:
        return self.root.ignored_fields()


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[Annotated[integer(ge=0), Field(json_schema_extra={"x-dllm-bound": "token"})]]


REQUEST_MODELS = {"ChatCompletionRequest": ChatCompletionRequest, "CompletionRequest": CompletionRequest,
                  "TokenizeRequest": TokenizeRequest, "DetokenizeRequest": DetokenizeRequest}
