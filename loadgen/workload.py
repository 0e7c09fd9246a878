"""Workloads: which prompts are sent and how many tokens each request asks for.

Owns: the ``RequestSpec`` sent by the client; ShareGPT-format files; synthetic lognormal length
distributions by median and spread with the ``sharegpt``/``arxiv`` presets and ``--length-scale``;
the arXiv-summarisation long-prompt/short-answer mix; random token-id prompts; turning a replay
trace into specs. Everything is a function of a seeded ``numpy.random.Generator``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .arrivals import TraceEntry
from .tokens import TokenCounter

# name -> (prompt median, prompt spread, output median, output spread); spread = lognormal sigma.
PRESETS: dict[str, tuple[float, float, float, float]] = {
    "sharegpt": (795.0, 1.0, 266.0, 0.8),
    "arxiv": (2827.0, 0.5, 162.0, 0.4),
}
DATASETS = ("synthetic", "sharegpt", "arxiv-mix", "random", "trace")

_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so what out "
    "up about into them can only other time new some could these two may first then do any like my "
    "now over such our man me even most made after also did many off before must through back "
    "years where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life being under "
    "never day same another know while last might us great old year since against go came right "
    "used take three model data method results show paper we propose learning network training "
    "approach performance task tasks language large diffusion tokens decoding parallel cache"
).split()
_SUMMARY_ASK = "\n\nSummarize the paper above in a short abstract."
_SHORT_ASK = "Answer briefly: "


@dataclass
class RequestSpec:
    """One request: a text prompt or a list of token ids, and how many tokens to ask for."""
    prompt: str | list[int]
    prompt_len: int
    output_len: int
    meta: dict = field(default_factory=dict)


@dataclass
class WorkloadOptions:
    dataset: str = "synthetic"
    dataset_path: str | None = None
    preset: str = "sharegpt"
    length_scale: float = 1.0
    spread: float | None = None
    prompt_len: int | None = None        # override the median prompt length
    output_len: int | None = None        # override every request's output length
    random_ids: bool = False
    vocab_size: int = 32000
    id_low: int = 0
    short_fraction: float = 0.25         # arxiv-mix: share of short chat-like questions
    max_model_len: int | None = None


def lognormal_lengths(median: float, spread: float, n: int, rng: np.random.Generator,
                      lo: int = 1, hi: int | None = None) -> np.ndarray:
    """Integer lengths ``round(median * exp(spread * Z))`` clipped to [lo, hi]."""
    if median <= 0 or spread < 0:
        raise ValueError(f"need median > 0 and spread >= 0, got {median}, {spread}")
    x = np.rint(median * np.exp(spread * rng.standard_normal(n)))
    return np.clip(x, lo, hi if hi is not None else np.inf).astype(int)


def preset_lengths(preset: str, n: int, rng: np.random.Generator, scale: float = 1.0,
                   spread: float | None = None, prompt_median: float | None = None,
                   output_median: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(prompt_lens, output_lens) drawn from a preset, medians multiplied by ``scale``."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    pm, ps, om, os_ = PRESETS[preset]
    pm = prompt_median if prompt_median is not None else pm * scale
    om = output_median if output_median is not None else om * scale
    if spread is not None:
        ps = os_ = spread
    return lognormal_lengths(pm, ps, n, rng), lognormal_lengths(om, os_, n, rng)


def fit_lengths(prompt_len: int, output_len: int, max_model_len: int | None) -> tuple[int, int]:
    """Shrink (output first to max_model_len-1, then prompt) so prompt + output fits the context."""
    if max_model_len is None:
        return prompt_len, output_len
    output_len = max(1, min(output_len, max_model_len - 1))
    prompt_len = max(1, min(prompt_len, max_model_len - output_len))
    return prompt_len, output_len


def random_ids(n_tokens: int, rng: np.random.Generator, vocab_size: int, low: int = 0) -> list[int]:
    if not 0 <= low < vocab_size:
        raise ValueError(f"need 0 <= id_low < vocab_size, got {low}, {vocab_size}")
    return rng.integers(low, vocab_size, size=n_tokens).tolist()


def make_text(n_tokens: int, rng: np.random.Generator, counter: TokenCounter) -> tuple[str, int]:
    """Random English-looking words of about ``n_tokens`` tokens; returns (text, token count).

    With a tokenizer the text is cut to exactly ``n_tokens`` ids and decoded; without one each
    common word is taken as one token.
    """
    words = [_WORDS[i] for i in rng.integers(0, len(_WORDS), size=max(1, n_tokens))]
    text = " ".join(words)
    if not counter.exact:
        return text, len(words)
    ids = counter.encode(text)[:n_tokens]
    return counter.decode(ids), len(ids)


def _prompt(n_tokens: int, rng, counter, opts: WorkloadOptions) -> tuple[str | list[int], int]:
    if opts.random_ids:
        return random_ids(n_tokens, rng, opts.vocab_size, opts.id_low), n_tokens
    return make_text(n_tokens, rng, counter)


def synthetic(n: int, rng, counter: TokenCounter, opts: WorkloadOptions) -> list[RequestSpec]:
    plens, olens = preset_lengths(opts.preset, n, rng, opts.length_scale, opts.spread,
                                  opts.prompt_len)
    if opts.output_len is not None:
        olens = np.full(n, opts.output_len)
    specs = []
    for pl, ol in zip(plens.tolist(), olens.tolist()):
        pl, ol = fit_lengths(pl, ol, opts.max_model_len)
        prompt, real = _prompt(pl, rng, counter, opts)
        specs.append(RequestSpec(prompt, real, ol, {"kind": opts.preset}))
    return specs


def arxiv_mix(n: int, rng, counter: TokenCounter, opts: WorkloadOptions) -> list[RequestSpec]:
    """Long "article + summarise" prompts with short answers, plus a share of short questions."""
    if opts.random_ids:
        raise ValueError("arxiv-mix builds text prompts; use --dataset random for token ids")
    short = rng.random(n) < opts.short_fraction
    lp, lo = preset_lengths("arxiv", n, rng, opts.length_scale, opts.spread, opts.prompt_len)
    sp, so = preset_lengths("sharegpt", n, rng, opts.length_scale, opts.spread)
    specs = []
    for i in range(n):
        pl, ol = (int(sp[i]), int(so[i])) if short[i] else (int(lp[i]), int(lo[i]))
        if opts.output_len is not None:
            ol = opts.output_len
        pl, ol = fit_lengths(pl, ol, opts.max_model_len)
        ask = _SHORT_ASK if short[i] else _SUMMARY_ASK
        body, _ = make_text(max(1, pl - counter.count(ask)), rng, counter)
        text = ask + body if short[i] else body + ask
        specs.append(RequestSpec(text, counter.count(text) if counter.exact else pl, ol,
                                 {"kind": "short" if short[i] else "summary"}))
    return specs


def load_sharegpt(path: str | Path, n: int, rng, counter: TokenCounter,
                  opts: WorkloadOptions) -> list[RequestSpec]:
    """Sample ``n`` conversations: turn 0 is the prompt, turn 1's length the expected output.

    Conversations with fewer than two turns, or prompt/output shorter than 4 tokens, or that do
    not fit ``max_model_len`` are skipped. Sampling is without replacement, cycling if needed.
    """
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    usable: list[RequestSpec] = []
    for idx in rng.permutation(len(data)).tolist():
        conv = data[idx].get("conversations") or []
        if len(conv) < 2:
            continue
        prompt, answer = str(conv[0].get("value", "")), str(conv[1].get("value", ""))
        pl = counter.count(prompt)
        ol = opts.output_len if opts.output_len is not None else counter.count(answer)
        if pl < 4 or ol < 4:
            continue
        if opts.max_model_len is not None and pl + ol > opts.max_model_len:
            continue
        usable.append(RequestSpec(prompt, pl, ol, {"kind": "sharegpt", "row": idx}))
        if len(usable) >= n:
            break
    if not usable:
        raise ValueError(f"no usable conversations in {path}")
    return [usable[i % len(usable)] for i in range(n)]


def from_trace(entries: list[TraceEntry], rng, counter: TokenCounter,
               opts: WorkloadOptions) -> list[RequestSpec]:
    specs = []
    for e in entries:
        if e.prompt is not None:
            pl = e.prompt_len if e.prompt_len is not None else counter.count(e.prompt)
            specs.append(RequestSpec(e.prompt, pl, e.output_len, {"kind": "trace"}))
        else:
            prompt, real = _prompt(int(e.prompt_len), rng, counter, opts)
            specs.append(RequestSpec(prompt, real, e.output_len, {"kind": "trace"}))
    return specs


def build_workload(n: int, rng: np.random.Generator, counter: TokenCounter,
                   opts: WorkloadOptions) -> list[RequestSpec]:
    """``n`` request specs for every dataset except ``trace`` (see ``from_trace``)."""
    if opts.dataset == "synthetic":
        return synthetic(n, rng, counter, opts)
    if opts.dataset == "random":
        return synthetic(n, rng, counter, WorkloadOptions(**{**opts.__dict__, "random_ids": True}))
    if opts.dataset == "arxiv-mix":
        return arxiv_mix(n, rng, counter, opts)
    if opts.dataset == "sharegpt":
        if not opts.dataset_path:
            raise ValueError("--dataset sharegpt needs --dataset-path FILE.json")
        return load_sharegpt(opts.dataset_path, n, rng, counter, opts)
    raise ValueError(f"unknown dataset {opts.dataset!r}; choose from {DATASETS}")
