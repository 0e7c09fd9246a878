"""What a request's consumer receives: new visible text, denoising progress or the final output."""
from __future__ import annotations

from dataclasses import dataclass

from ..messages import StepDelta
from .state import GenerationOutput

STREAM_NONE, STREAM_TEXT, STREAM_PROGRESS = "none", "text", "progress"


@dataclass(slots=True)
class StreamEvent:
    request_id: str
    delta: StepDelta | None = None
    text: str | None = None           # the whole stable visible text so far
    canvas: str | None = None         # this and tokens: progress streams only
    tokens: list[str] | None = None
    output: GenerationOutput | None = None
    logprobs: list | None = None      # text streams that asked: (token id, entry) of the tokens newly visible
    edits: list | None = None         # progress streams under token editing: (answer position, from id, to id)
