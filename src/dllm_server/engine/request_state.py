"""RequestState: the request side's view of one generation (host canvas, block progress,
stats) and the assembly of its final output. Shared by the offline LLM and the serving engine;
knows nothing of HTTP, queues or workers."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decoding.canvas import answer_len, num_blocks
from ..decoding.params import SamplingParams
from ..decoding.stop import visible_len
from ..messages import StepDelta, SubmitBlock


@dataclass(slots=True)
class GenerationStats:
    num_forwards: int = 0
    steps_per_block: list[int] = field(default_factory=list)
    num_blocks_run: int = 0
    num_committed: int = 0

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

    @property
    def tokens_per_forward(self) -> float:
        return self.stats.tokens_per_forward(len(self.token_ids))


class RequestState:
    def __init__(self, request_id: str, prompt: str | None, prompt_ids: list[int], params: SamplingParams,
                 mask_id: int, stop_ids: tuple[int, ...], arrival_seq: int):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = prompt_ids
        self.params = params
        self.mask_id = mask_id
        self.stop_ids = stop_ids
        self.arrival_seq = arrival_seq
        self.prompt_len = len(prompt_ids)
        self.answer_len = answer_len(params.max_tokens, params.block_length)
        self.num_blocks = num_blocks(params.max_tokens, params.block_length)
        self.canvas = torch.full((self.prompt_len + self.answer_len,), mask_id, dtype=torch.int64)
        self.canvas[: self.prompt_len] = torch.tensor(prompt_ids, dtype=torch.int64)
        self.block_index = 0
        self.stats = GenerationStats()
        self.stop_ids_tensor = torch.tensor(stop_ids, dtype=torch.int64)

    def submit_msg(self) -> SubmitBlock:
        return SubmitBlock(self.request_id, self.block_index, self.prompt_len, self.canvas.clone(),
                           self.params, self.stop_ids, self.arrival_seq)

    def apply(self, delta: StepDelta) -> None:
        if delta.positions:
            self.canvas[list(delta.positions)] = torch.tensor(delta.token_ids, dtype=torch.int64)
        self.stats.num_forwards += 1
        self.stats.num_committed += len(delta.positions)

    def block_done(self, num_steps: int) -> None:
        self.stats.steps_per_block.append(num_steps)
        self.stats.num_blocks_run += 1
        self.block_index += 1

    @property
    def has_next_block(self) -> bool:
        return self.block_index < self.num_blocks

    @property
    def answer(self) -> torch.Tensor:
        return self.canvas[self.prompt_len:]

    def committed_prefix(self) -> list[int]:
        """Visible answer tokens up to the first still-masked position (safe to show)."""
        a = self.answer[: visible_len(self.answer, self.stop_ids_tensor, self.params.max_tokens,
                                      self.params.ignore_eos)]
        masked = (a == self.mask_id).nonzero()
        end = int(masked[0, 0]) if masked.numel() else a.numel()
        return a[:end].tolist()

    def finish(self, text: str, finish_reason: str | None = None, error: str | None = None,
               text_cut: bool = False) -> GenerationOutput:
        """Final output. `text_cut`: a stop string ended the text (finish_reason "stop")."""
        p = self.params
        n = visible_len(self.answer, self.stop_ids_tensor, p.max_tokens, p.ignore_eos)
        token_ids = self.answer[:n].tolist()
        stopped_by_token = n < min(p.max_tokens, self.answer_len) and not p.ignore_eos
        if stopped_by_token:
            token_ids.append(int(self.answer[n]))
        if finish_reason is None:
            finish_reason = "stop" if (stopped_by_token or text_cut) else "length"
        return GenerationOutput(self.request_id, self.prompt, self.prompt_ids, text, token_ids,
                                finish_reason, self.stats, error)
