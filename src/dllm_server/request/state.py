"""RequestState: one generation's canvas, block progress, visible text and stats; work per step grows only with
what the step committed (the committed prefix only grows and is detokenized incrementally)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..decoding.params import BlockPolicy, DecodeParams, SamplingParams
from ..messages import StepDelta, SubmitBlock
from .detok import IncrementalDetokenizer


@dataclass(slots=True)
class GenerationStats:
    num_forwards: int = 0
    steps_per_block: list[int] = field(default_factory=list)
    num_blocks_run: int = 0
    num_committed: int = 0
    block_policies: list[BlockPolicy] = field(default_factory=list)
    latency_s: float | None = None       # arrival to finish, served requests only
    constrained_forwards: int = 0        # structured output: forwards whose commits the constraint chose
    constraint_ms: float = 0.0           # and the time its dynamic program took over them
    num_edits: int = 0                   # token editing: filled positions rewritten

    def tokens_per_forward(self, num_tokens: int) -> float:
        return num_tokens / self.num_forwards if self.num_forwards else 0.0


@dataclass(slots=True)
class GenerationOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str            # "stop" | "length" | "abort" | "error"
    stats: GenerationStats
    error: str | None = None
    logprobs: list | None = None  # asked for: per token_ids entry (logprob, ((alternative id, logprob), ...))

    @property
    def tokens_per_forward(self) -> float:
        return self.stats.tokens_per_forward(len(self.token_ids))


class RequestState:
    def __init__(self, request_id: str, prompt: str | None, prompt_ids: list[int], sampling: SamplingParams,
                 params: DecodeParams, mask_id: int, stop_ids: tuple[int, ...], arrival_seq: int,
                 decode=None):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.params = params
        self.mask_id = mask_id
        self.stop_ids = stop_ids
        self._stop_set = frozenset(() if params.ignore_eos else stop_ids)
        self.arrival_seq = arrival_seq
        self.arrived_at = 0.0                # set when the scheduler admits it (its clock)
        self.prompt_len = len(prompt_ids)
        self._prompt_array = None
        self.answer_len = params.answer_len(self.prompt_len)
        self.num_blocks = params.num_blocks(self.prompt_len)
        self.answer = [mask_id] * self.answer_len
        self.block_index = 0
        self.stats = GenerationStats()
        self._limit = min(params.max_tokens, self.answer_len)
        self.prefix_end = 0               # answer[:prefix_end] is committed and holds no stop token
        self.final_end = 0 if params.editing else self.answer_len   # answer[:final_end] can no longer change
        self.last_edits: list[tuple[int, int, int]] = []             # the last step's (answer position, from, to)
        self.stopped = False
        self.detok = IncrementalDetokenizer(decode) if decode is not None else None
        self.logprobs: dict[int, tuple] | None = {} if params.logprobs is not None else None   # answer position ->
        self.logprobs_sent = 0            # answer positions whose logprobs went out with a stream event

    def submit_msg(self, policy: BlockPolicy, then: BlockPolicy | None = None, step_offset: int = 0,
                   restart: bool = False) -> SubmitBlock:
        """The current block for a worker that does not hold this request's canvas; `restart`: from the block's
        start (its commits so far masked again: a worker died mid-block, and a redone block commits the same)."""
        # NumPy: a fraction of torch.tensor's time on a long Python list
        if self._prompt_array is None:
            self._prompt_array = np.array(self.prompt_ids, dtype=np.int64)
        canvas = torch.from_numpy(np.concatenate((self._prompt_array, np.array(self.answer, dtype=np.int64))))
        if restart:
            start, end = self.params.block_bounds(self.prompt_len, self.block_index)
            canvas[max(start, self.prompt_len):end] = self.mask_id
        return SubmitBlock(self.request_id, self.block_index, self.prompt_len, canvas, self.params, policy,
                           self.stop_ids, self.arrival_seq, step_offset, then=then)

    def apply(self, delta: StepDelta) -> str | None:
        """Commit a step's positions; the stable text it added ("" if none), or None if the prefix did not grow."""
        base = self.prompt_len
        answer = self.answer
        if self.params.editing:
            mask = self.mask_id
            self.last_edits = [(p - base, answer[p - base], t) for p, t in zip(delta.positions, delta.token_ids)
                               if answer[p - base] != mask]
            self.stats.num_edits += len(self.last_edits)
        for pos, tok in zip(delta.positions, delta.token_ids):
            answer[pos - base] = tok
        if delta.logprobs and self.logprobs is not None:
            for pos, lp in zip(delta.positions, delta.logprobs):
                self.logprobs[pos - base] = lp
        self.stats.num_forwards += 1
        self.stats.num_committed += len(delta.positions) - len(self.last_edits)
        if delta.constraint_ms:
            self.stats.constrained_forwards += 1
            self.stats.constraint_ms += delta.constraint_ms
        return self._advance_prefix()

    def _advance_prefix(self) -> str | None:
        start = end = self.prefix_end
        answer, mask, stops = self.answer, self.mask_id, self._stop_set
        limit = min(self._limit, self.final_end)
        while end < limit and not self.stopped:
            tok = answer[end]
            if tok == mask:
                break
            if tok in stops:
                self.stopped = True
                break
            end += 1
        if end == start:
            return None
        self.prefix_end = end
        return self.detok.push(answer[start:end]) if self.detok is not None else ""

    def block_done(self, num_steps: int, policy: BlockPolicy | None) -> str | None:
        """The block ended; under token editing its text becomes final now (returned as `apply` does)."""
        self.stats.steps_per_block.append(num_steps)
        self.stats.num_blocks_run += 1
        if policy is not None:
            self.stats.block_policies.append(policy)
        end = self.params.block_bounds(self.prompt_len, self.block_index)[1]
        self.block_index += 1
        if not self.params.editing:
            return None
        self.final_end = end - self.prompt_len
        return self._advance_prefix()

    @property
    def has_next_block(self) -> bool:
        return self.block_index < self.num_blocks

    @property
    def is_final(self) -> bool:
        """Nothing visible can change: the committed prefix reached a stop token or the limit."""
        return self.stopped or self.prefix_end >= self._limit

    @property
    def text(self) -> str:
        return self.detok.text if self.detok is not None else ""

    @property
    def tentative_text(self) -> str:
        """The stable text plus what its held-back tokens decode to for now (maybe ending in U+FFFD)."""
        return self.detok.flush() if self.detok is not None else ""

    def committed_prefix(self) -> list[int]:
        return self.answer[: self.prefix_end]

    def visible_len(self) -> int:
        """Up to the first committed stop token anywhere in the answer (exclusive), capped at max_tokens."""
        if self._stop_set:
            for i in range(self._limit):
                if self.answer[i] in self._stop_set:
                    return i
        return self._limit

    def finish(self, text: str | None = None, finish_reason: str | None = None, error: str | None = None,
               text_cut: bool = False) -> GenerationOutput:
        """Final output; `text` defaults to the whole visible text; `text_cut`: a stop string ended it."""
        if text is None:
            text = self.detok.flush() if self.detok is not None else ""
        n = self.visible_len()
        token_ids = self.answer[:n]
        stopped_by_token = n < self._limit and not self.params.ignore_eos
        if stopped_by_token:
            token_ids.append(self.answer[n])
        if finish_reason is None:
            finish_reason = "stop" if (stopped_by_token or text_cut) else "length"
        lps = None if self.logprobs is None else [self.logprobs.get(i) for i in range(len(token_ids))]
        return GenerationOutput(self.request_id, self.prompt, self.prompt_ids, text, token_ids,
                                finish_reason, self.stats, error, lps)

    def take_logprobs(self) -> list[tuple[int, tuple]] | None:
        """(token id, logprob entry) of the committed prefix not yet streamed (None: not asked for)."""
        if self.logprobs is None:
            return None
        out = [(self.answer[i], self.logprobs.get(i)) for i in range(self.logprobs_sent, self.prefix_end)]
        self.logprobs_sent = self.prefix_end
        return out
