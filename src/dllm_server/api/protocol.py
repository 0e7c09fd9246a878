"""Pydantic models of the OpenAI wire format (as vLLM accepts it) plus our diffusion extras,
and their conversion to SamplingParams. No I/O here."""
from __future__ import annotations

import logging
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, RootModel, StrictBool, StrictInt, StringConstraints,
                      model_validator)

from ..decoding.params import MAX_SEED, SamplingParams

log = logging.getLogger(__name__)
NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]


class OpenAIModel(BaseModel):
    # Unknown fields are accepted, logged and ignored (vLLM's behaviour). Strict: JSON `false`
    # is not a number and "yes" is not a boolean.
    model_config = ConfigDict(extra="allow", strict=True)

    def ignored_fields(self) -> list[str]:
        return sorted((self.model_extra or {}).keys())


class StreamOptions(OpenAIModel):
    include_usage: StrictBool = False
    include_progress: StrictBool = Field(False, description="dllm: stream denoising progress chunks (choices: [])")


class DiffusionFields(OpenAIModel):
    """Sampling fields shared by chat and completions, plus the diffusion extras."""
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Field(max_length=16)], None] = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    user: str | None = None
    ignore_eos: StrictBool = False
    logprobs: StrictBool | None = Field(None, description="only false: not supported for diffusion models")
    top_logprobs: StrictInt | None = Field(None, ge=0, le=0, description="only 0: not supported")
    presence_penalty: float | None = Field(None, ge=0, le=0, description="only 0 (not supported)")
    frequency_penalty: float | None = Field(None, ge=0, le=0, description="only 0 (not supported)")
    # diffusion extras
    block_length: int | None = Field(None, ge=1, le=256)
    threshold: float | None = Field(None, ge=0, le=1)
    factor: float | None = Field(None, gt=0, le=1e6)
    steps: int | None = Field(None, ge=1, le=1_000_000)
    entropy_bound: float | None = Field(None, ge=0, le=1e6, description="dllm: EB-sampler rule: commit, by confidence, "
                                        "the most masked positions whose summed entropy minus its largest stays <= this")
    remasking: Literal["low_confidence", "random"] = SamplingParams().remasking
    slo_ms: float | None = Field(None, gt=0, le=86_400_000, description="dllm: end-to-end latency target (ms) from "
                                 "arrival; with --threshold-policy slo each block's threshold is chosen to meet it")
    return_token_ids: StrictBool = False

    @model_validator(mode="after")
    def _checks(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream=true")
        if self.logprobs:
            raise ValueError("logprobs: not supported for diffusion models (no left-to-right likelihood)")
        return self

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """Only the fields the request gave: SamplingParams holds every default."""
        max_tokens = self.max_completion_tokens or self.max_tokens or default_max_tokens
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        given = {k: getattr(self, k) for k in ("temperature", "top_p", "threshold", "factor", "steps", "seed",
                                               "block_length", "slo_ms", "entropy_bound") if getattr(self, k) is not None}
        return SamplingParams(max_tokens=max_tokens, remasking=self.remasking, ignore_eos=self.ignore_eos,
                              stop=tuple(stop) if stop else None, **given)

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
    messages: list[ChatMessage] = Field(..., min_length=1)


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(DiffusionFields):
    prompt: Union[NonEmptyStr, Annotated[list[NonEmptyStr], Field(min_length=1)], TokenIds,
                  Annotated[list[TokenIds], Field(min_length=1)]]
    echo: StrictBool = Field(False, description="only false: not supported")

    @model_validator(mode="after")
    def _no_echo(self):
        if self.echo:
            raise ValueError("echo: not supported")
        return self

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


class TokenizeMessages(OpenAIModel):
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)


class TokenizeRequest(RootModel[Union[TokenizePrompt, TokenizeMessages]]):
    """Either {"prompt": ...} or {"messages": [...]}."""

    @property
    def model(self) -> str | None:
        return self.root.model

    def ignored_fields(self) -> list[str]:
        return self.root.ignored_fields()


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


REQUEST_MODELS = {"ChatCompletionRequest": ChatCompletionRequest, "CompletionRequest": CompletionRequest,
                  "TokenizeRequest": TokenizeRequest, "DetokenizeRequest": DetokenizeRequest}
