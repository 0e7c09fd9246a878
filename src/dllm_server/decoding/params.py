"""Decoding parameters as a request asks them (`SamplingParams`, None: the server default) and as resolved:
`DecodeParams` for the whole request, `BlockPolicy` per block (chosen by policy/). No torch here."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from .canvas import answer_len, block_bounds, num_blocks

REMASKING = ("low_confidence", "random")

MAX_SEED = 2**63 - 1
MAX_LOGPROBS = 20                   # top alternatives per token, as OpenAI's top_logprobs allows
DEFAULT_POST_EDIT_STEPS = 16        # diffusers' LLaDA2Pipeline default (max_post_steps)
MAX_POST_EDIT_STEPS = 256           # a block's editing forwards cost like its filling ones: bounded per request


def sample_seed(seed: int, index: int) -> int:
    """Seed of sample `index` of an n > 1 request, so each sample is exactly the n=1 request with that seed."""
    return (seed + index) % (MAX_SEED + 1)


def request_seed(base_seed: int, arrival_seq: int) -> int:
    """The seed of a request that gave none: fixed at arrival, so batching never changes it."""
    return (base_seed * 1_000_003 + arrival_seq * 7_919 + 1) % (2**63)


@dataclass(frozen=True, slots=True)
class StructuredOutputs:
    """What the answer must be (vLLM's name): one of `json` (a JSON schema, dict or text), `json_object` (any
    JSON object) or `regex`; structured/ compiles it. `field` is the request field errors name."""
    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    field: str = "response_format"

    def __post_init__(self) -> None:
        if sum([self.json is not None, self.json_object, self.regex is not None]) != 1:
            raise ValueError(f"{self.field}: give exactly one of a JSON schema, a JSON object or a regex")

    @property
    def key(self) -> str:
        """What is compiled, as text (the compile cache's key)."""
        if self.regex is not None:
            return "regex:" + str(self.regex)
        if self.json_object:
            return "json_object"
        return "json:" + (self.json if isinstance(self.json, str) else json.dumps(self.json, sort_keys=True))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0                       # 0 (or -1, as vLLM): off
    min_p: float = 0.0
    threshold: float | None = None
    factor: float | None = None
    steps: int | None = None
    remasking: str = "low_confidence"
    ignore_eos: bool = False
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    block_length: int | None = None
    slo_ms: float | None = None
    entropy_bound: float | None = None
    logprobs: int | None = None          # per answer token its log-probability and this many alternatives
    structured_outputs: StructuredOutputs | None = None
    edit_threshold: float | None = None      # LLaDA2.1's token editing (None: off): rewrite a filled position
    max_post_edit_steps: int | None = None   # forwards a block may spend editing after its masks are filled

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name}: {why}")

        def is_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not is_int(self.max_tokens) or self.max_tokens < 1:
            bad("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not is_num(self.temperature) or self.temperature < 0:
            bad("temperature", f"must be a finite number >= 0, got {self.temperature!r}")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or self.top_k < -1:
            bad("top_k", f"must be an integer >= 1, or 0 / -1 for no limit, got {self.top_k!r}")
        if not is_num(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", f"must be in [0, 1], got {self.min_p!r}")
        if self.threshold is not None and (not is_num(self.threshold) or not 0 <= self.threshold <= 1):
            bad("threshold", f"must be in [0, 1], got {self.threshold!r}")
        if self.factor is not None and (not is_num(self.factor) or self.factor <= 0):
            bad("factor", f"must be a finite number > 0, got {self.factor!r}")
        if self.steps is not None and (not is_int(self.steps) or self.steps < 1):
            bad("steps", f"must be an integer >= 1, got {self.steps!r}")
        if self.remasking not in REMASKING:
            bad("remasking", f"must be one of {REMASKING}, got {self.remasking!r}")
        if self.remasking == "random" and self.steps is None:
            bad("remasking", "'random' ranks positions for the fixed-steps schedule; give steps too")
        if self.factor is not None and self.steps is not None:
            bad("factor", "choose one rule: factor or steps, not both")
        if self.entropy_bound is not None and (not is_num(self.entropy_bound) or self.entropy_bound < 0):
            bad("entropy_bound", f"must be a finite number >= 0, got {self.entropy_bound!r}")
        if self.entropy_bound is not None and (self.factor is not None or self.steps is not None):
            bad("entropy_bound", "choose one rule: entropy_bound, factor or steps")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            bad("seed", f"must be an integer in [0, 2**63), got {self.seed!r}")
        if self.stop is not None:
            stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
            if not all(isinstance(s, str) and s for s in stop):
                bad("stop", "must be a non-empty string or a list of non-empty strings")
            object.__setattr__(self, "stop", stop)
        if self.block_length is not None and (not is_int(self.block_length) or self.block_length < 1):
            bad("block_length", f"must be an integer >= 1, got {self.block_length!r}")
        if self.slo_ms is not None and (not is_num(self.slo_ms) or self.slo_ms <= 0):
            bad("slo_ms", f"must be a finite number > 0, got {self.slo_ms!r}")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", f"must be a boolean, got {self.ignore_eos!r}")
        if self.logprobs is not None and (not is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            bad("logprobs", f"must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if self.edit_threshold is not None and (not is_num(self.edit_threshold) or not 0 < self.edit_threshold <= 1):
            bad("edit_threshold", f"must be in (0, 1], got {self.edit_threshold!r}")
        if self.max_post_edit_steps is not None and (not is_int(self.max_post_edit_steps)
                                                     or not 0 <= self.max_post_edit_steps <= MAX_POST_EDIT_STEPS):
            bad("max_post_edit_steps", f"must be an integer in [0, {MAX_POST_EDIT_STEPS}], "
                f"got {self.max_post_edit_steps!r}")
        if self.max_post_edit_steps is not None and self.edit_threshold is None:
            bad("max_post_edit_steps", "applies to token editing: give edit_threshold too")
        so = self.structured_outputs
        if so is not None and self.edit_threshold is not None:
            bad("edit_threshold", f"cannot be combined with {so.field} (a constrained canvas is never rewritten)")
        if so is not None and not isinstance(so, StructuredOutputs):
            bad("structured_outputs", f"must be a StructuredOutputs, got {type(so).__name__}")
        if so is not None and self.ignore_eos:
            bad(so.field, "cannot be combined with ignore_eos (the answer ends where the document does)")

    def resolve(self, default_block_length: int, default_seed: int, model_block: int = 0) -> "DecodeParams":
        """Defaults filled, seed fixed; a block-causal model (`model_block` > 0) decodes only in its own blocks."""
        if model_block:
            if self.block_length is not None and self.block_length != model_block:
                raise ValueError(f"block_length: this model decodes in its own blocks of {model_block} "
                                 f"(block-causal attention), got {self.block_length}")
            block = model_block
        else:
            block = default_block_length if self.block_length is None else self.block_length
        return DecodeParams(self.max_tokens, block, self.temperature, self.top_p, self.remasking,
                            default_seed if self.seed is None else self.seed, self.ignore_eos, max(0, self.top_k),
                            float(self.min_p), block_causal=bool(model_block), logprobs=self.logprobs,
                            edit_threshold=self.edit_threshold,
                            max_post_edit_steps=(DEFAULT_POST_EDIT_STEPS if self.max_post_edit_steps is None
                                                 else self.max_post_edit_steps))


@dataclass(frozen=True, slots=True)
class DecodeParams:
    """Resolved per request and shared by its blocks: the worker's sampler and stop rule."""
    max_tokens: int
    block_length: int
    temperature: float
    top_p: float
    remasking: str
    seed: int
    ignore_eos: bool
    top_k: int = 0
    min_p: float = 0.0
    block_causal: bool = False
    logprobs: int | None = None     # None: none; n: each committed token's and n alternatives (its forward's)
    constraint: str | None = None   # the regex the answer must match (structured/, compiled by the front)
    edit_threshold: float | None = None   # token editing: a filled answer position of the current block whose
    max_post_edit_steps: int = 0          # proposal differs with confidence >= this is rewritten (docs/llada2.md)

    @property
    def editing(self) -> bool:
        return self.edit_threshold is not None

    @property
    def needs_rng(self) -> bool:
        return self.temperature > 0 or self.remasking == "random"

    def answer_len(self, prompt_len: int) -> int:
        return answer_len(self.max_tokens, self.block_length, prompt_len, self.block_causal)

    def num_blocks(self, prompt_len: int) -> int:
        return num_blocks(self.max_tokens, self.block_length, prompt_len, self.block_causal)

    def block_bounds(self, prompt_len: int, block_index: int) -> tuple[int, int]:
        return block_bounds(prompt_len, block_index, self.block_length, self.block_causal)


@dataclass(frozen=True, slots=True)
class BlockPolicy:
    """One block's commit rule: the first set of `steps`, `factor`, `entropy_bound`, else `threshold`; and its
    `priority` among a worker's waiting blocks (smaller first; ties in arrival order; 0 for all under FCFS)."""
    threshold: float
    factor: float | None = None
    steps: int | None = None
    entropy_bound: float | None = None
    priority: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, (int, float)) and 0.0 <= self.threshold <= 1.0):
            raise ValueError(f"threshold: must be in [0, 1], got {self.threshold!r}")
        if self.factor is not None and not self.factor > 0:
            raise ValueError(f"factor: must be > 0, got {self.factor!r}")
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps < 1):
            raise ValueError(f"steps: must be >= 1, got {self.steps!r}")
        if self.entropy_bound is not None and not self.entropy_bound >= 0:
            raise ValueError(f"entropy_bound: must be >= 0, got {self.entropy_bound!r}")
