"""How a request advances on each worker message; where (and how) its next block runs is the caller's decision."""
from __future__ import annotations

from dataclasses import dataclass

from ..messages import BlockDone, RequestFailed, StepDelta
from .state import GenerationOutput, RequestState
from .events import StreamEvent
from .tokenize import Tokenizer


@dataclass(slots=True)
class Outcome:
    added: str = ""
    next_block: bool = False                   # route the next block (a re-prefill)
    continued: bool = False                    # the next block is already queued where this one ran
    output: GenerationOutput | None = None
    abort_worker: bool = False                 # the worker still holds the block: abort it


MASK_GLYPH = "\u2591"


def canvas_text(st: RequestState, tokenizer: Tokenizer | None) -> str:
    """The visible answer with masked positions as MASK_GLYPH; decodes it all, so for progress streams only."""
    if tokenizer is None:
        return ""
    answer = st.answer[: st.visible_len()]
    parts, run = [], []
    for tok in answer:
        if tok == st.mask_id:
            if run:
                parts.append(tokenizer.decode(run))
                run = []
            parts.append(MASK_GLYPH)
        else:
            run.append(tok)
    if run:
        parts.append(tokenizer.decode(run))
    return "".join(parts)


def token_texts(token_ids, tokenizer: Tokenizer | None) -> list[str]:
    return [tokenizer.token_text(t) for t in token_ids] if tokenizer is not None else []


def progress_event(st: RequestState, delta: StepDelta, tokenizer: Tokenizer | None) -> StreamEvent:
    return StreamEvent(st.request_id, delta, st.text, canvas_text(st, tokenizer),
                       token_texts(delta.token_ids, tokenizer), edits=list(st.last_edits) if st.params.editing else None)


def _stop_hit(st: RequestState, text: str, added: str) -> int:
    """Index in `text` of the first stop string this step completes, or -1 (searched from the changed text)."""
    lo = max(0, len(st.text) - len(added) - max(len(s) for s in st.sampling.stop) + 1)
    hits = [i for i in (text.find(s, lo) for s in st.sampling.stop) if i >= 0]
    return min(hits) if hits else -1


def _stop_string_cut(st: RequestState, added: str | None) -> Outcome | None:
    """The finished request when the text just added completes a stop string."""
    if added is None or not st.sampling.stop:
        return None
    text = st.tentative_text
    hit = _stop_hit(st, text, added)
    return Outcome(added, output=st.finish(text[:hit], text_cut=True), abort_worker=True) if hit >= 0 else None


def advance(st: RequestState, msg) -> Outcome:
    if isinstance(msg, StepDelta):
        added = st.apply(msg)
        cut = _stop_string_cut(st, added)
        return cut or Outcome(added or "")
    if isinstance(msg, BlockDone):
        added = st.block_done(msg.num_steps, msg.policy)      # token editing: the block's text is final now
        if msg.is_final or not st.has_next_block:
            return Outcome(added or "", output=st.finish())
        cut = _stop_string_cut(st, added)
        if cut is not None:
            cut.continued = cut.abort_worker = msg.continued      # the next block is already queued there
            return cut
        return Outcome(added or "", continued=msg.continued, next_block=not msg.continued)
    if isinstance(msg, RequestFailed):
        return Outcome(output=st.finish(finish_reason="error", error=msg.message))
    raise TypeError(f"unexpected message {type(msg).__name__}")
