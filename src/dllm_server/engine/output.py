"""How a request advances on each worker message: apply deltas, cut at stop strings, move to the
next block or finish. One function serves the offline LLM and the serving scheduler alike."""
from __future__ import annotations

from dataclasses import dataclass

from ..messages import BlockDone, RequestFailed, StepDelta, SubmitBlock
from ..decoding.stop import visible_len
from .request_state import GenerationOutput, RequestState
from .tokenize import Tokenizer


@dataclass(slots=True)
class Outcome:
    next_block: SubmitBlock | None = None      # submit this re-prefill
    output: GenerationOutput | None = None     # the request is finished
    abort_worker: bool = False                 # the worker still holds the block: abort it


def visible_text(st: RequestState, tokenizer: Tokenizer | None) -> str:
    return tokenizer.decode(st.committed_prefix()) if tokenizer is not None else ""


MASK_GLYPH = "\u2591"


def canvas_text(st: RequestState, tokenizer: Tokenizer | None) -> str:
    """The visible answer with every still-masked position shown as MASK_GLYPH."""
    if tokenizer is None:
        return ""
    answer = st.answer[: visible_len(st.answer, st.stop_ids_tensor, st.params.max_tokens, st.params.ignore_eos)]
    parts, run = [], []
    for tok in answer.tolist():
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


def advance(st: RequestState, msg, tokenizer: Tokenizer | None) -> Outcome:
    if isinstance(msg, StepDelta):
        st.apply(msg)
        if st.params.stop and tokenizer is not None:
            text = visible_text(st, tokenizer)
            hits = [i for i in (text.find(s) for s in st.params.stop) if i >= 0]
            if hits:
                return Outcome(output=st.finish(text[: min(hits)], text_cut=True), abort_worker=True)
        return Outcome()
    if isinstance(msg, BlockDone):
        st.block_done(msg.num_steps)
        if msg.is_final or not st.has_next_block:
            return Outcome(output=st.finish(visible_text(st, tokenizer)))
        return Outcome(next_block=st.submit_msg())
    if isinstance(msg, RequestFailed):
        return Outcome(output=st.finish(visible_text(st, tokenizer), finish_reason="error", error=msg.message))
    raise TypeError(f"unexpected message {type(msg).__name__}")
