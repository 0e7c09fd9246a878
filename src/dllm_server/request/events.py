"""What a request's consumer receives: new visible text, denoising progress or the final output."""
from __future__ import annotations

from dataclasses import dataclass

from ..messages import StepDelta
from .state import GenerationOutput

# What a request's consumer wants besides the final output.
STREAM_NONE, STREAM_TEXT, STREAM_PROGRESS = "none", "text", "progress"


@dataclass(slots=True)
class StreamEvent:
    """What a client sees: new visible text (text streams), a step (progress streams), or the
    final output."""
    request_id: str
    delta: StepDelta | None = None
    text: str | None = None           # the whole stable visible text so far
    canvas: str | None = None         # progress streams: the answer with masks shown
    tokens: list[str] | None = None   # progress streams: each committed token's own text
    output: GenerationOutput | None = None
