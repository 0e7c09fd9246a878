"""Log-probabilities in OpenAI's two shapes. An entry is one answer token's (logprob, ((alternative id,
logprob), ...)) from the forward that committed it (decoding/commit.py committed_logprobs)."""
from __future__ import annotations

from typing import Callable


def token_namer(tokenizer) -> Callable[[int], str]:
    """A token's own text, or `token_id:N` without a tokenizer (vLLM's spelling)."""
    return tokenizer.token_text if tokenizer is not None else (lambda t: f"token_id:{t}")


def chat_content(tokens: list[tuple[int, tuple | None]], name: Callable[[int], str]) -> list[dict]:
    """Chat's `logprobs.content`: per token its text, logprob, UTF-8 bytes and top alternatives."""
    def item(token_id: int, logprob: float) -> dict:
        text = name(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
    out = []
    for token_id, entry in tokens:
        logprob, alternatives = entry if entry is not None else (float("nan"), ())
        out.append({**item(token_id, logprob), "top_logprobs": [item(t, v) for t, v in alternatives]})
    return out


def completion_logprobs(tokens: list[tuple[int, tuple | None]], name: Callable[[int], str],
                        text_offset: int = 0) -> dict:
    """Completions' `logprobs`: parallel lists, the alternatives as {text: logprob}, character offsets."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, entry in tokens:
        logprob, alternatives = entry if entry is not None else (float("nan"), ())
        text = name(token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append({name(t): v for t, v in alternatives})
        out["text_offset"].append(text_offset)
        text_offset += len(text)
    return out
