"""A request's denoising so far (Progress, fed each StepDelta) and the step predictor's features. The SLO policy and
the trace writer share feature_row, so a predictor is trained on exactly the features it is later given."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..decoding.commit import CONFIDENCE_STATS
from ..request.state import RequestState
from ..messages import StepDelta

FEATURES = ("tau", "block_index", "blocks_left", "step", "masked_in_block", "masked_frac", "committed_last",
            "answer_masked", "prefix_frac", "eos_seen", "forwards", "mean_block_forwards", "prompt_len",
            "max_tokens", "block_length", *CONFIDENCE_STATS, "clear_tau", "clear_tau_frac")
TARGETS = ("block_rem", "fut_forwards", "fut_blocks")
UNKNOWN = -1.0       # a feature not observed yet (before the first step; no finished block)


@dataclass(slots=True)
class Progress:
    prompt_len: int
    max_tokens: int
    block_length: int
    num_blocks: int
    stop_ids: frozenset
    block_sizes: tuple[int, ...] = ()  # positions to commit per block: the first and last may be short
    block_index: int = 0
    step: int = 0                      # forwards of the current block so far
    masked_in_block: int = 0
    committed_last: int = 0
    answer_masked: int = 0
    prefix_len: int = 0
    forwards: int = 0
    eos_seen: bool = False
    finished_blocks: list[int] = field(default_factory=list)   # forwards per finished block
    summary: tuple[float, ...] = ()
    updated: bool = True               # new observations since the last prediction

    @classmethod
    def start(cls, st: RequestState) -> "Progress":
        p = st.params
        limit = min(p.max_tokens, st.answer_len)      # the request ends once these are committed
        sizes = tuple(max(1, min(end - st.prompt_len, limit) - max(0, start - st.prompt_len))
                      for start, end in (p.block_bounds(st.prompt_len, k) for k in range(st.num_blocks)))
        return cls(st.prompt_len, p.max_tokens, p.block_length, st.num_blocks,
                   frozenset(() if p.ignore_eos else st.stop_ids), sizes,
                   masked_in_block=sizes[0] if sizes else p.block_length, answer_masked=st.answer_len)

    def block_fraction(self, k: int) -> float:
        """Block k's answer positions over the block length (1 past the end)."""
        return self.block_sizes[k] / self.block_length if k < len(self.block_sizes) else 1.0

    def observe(self, delta: StepDelta, st: RequestState) -> None:
        if delta.block_index != self.block_index:
            self.block_index = delta.block_index
        self.step = delta.step + 1
        self.forwards += 1
        self.committed_last = len(delta.positions)
        self.answer_masked = delta.num_masked
        start, end = st.params.block_bounds(st.prompt_len, delta.block_index)
        lo, hi = max(0, start - st.prompt_len), end - st.prompt_len
        self.masked_in_block = st.answer[lo:hi].count(st.mask_id)
        self.prefix_len = st.prefix_end
        if not self.eos_seen and self.stop_ids:
            self.eos_seen = any(t in self.stop_ids for t in delta.token_ids)
        self.summary = delta.features
        self.updated = True

    def end_block(self, num_steps: int) -> None:
        self.finished_blocks.append(num_steps)
        self.block_index += 1
        self.step = 0
        self.masked_in_block = round(self.block_fraction(self.block_index) * self.block_length)
        self.summary = ()
        self.updated = True


def feature_row(p: Progress, tau: float, candidates: tuple[float, ...]) -> list[float]:
    """The predictor's input for `p` if its blocks committed at threshold `tau`."""
    n_stats = len(CONFIDENCE_STATS)
    if p.summary:
        stats = list(p.summary[:n_stats])
        counts = p.summary[n_stats:]
        clear = float(counts[candidates.index(tau)]) if tau in candidates and len(counts) == len(candidates) \
            else UNKNOWN
    else:
        stats, clear = [UNKNOWN] * n_stats, UNKNOWN
    done = p.finished_blocks
    return [tau, p.block_index, p.num_blocks - p.block_index - 1, p.step, p.masked_in_block,
            p.masked_in_block / p.block_length, p.committed_last, p.answer_masked, p.prefix_len / p.max_tokens,
            float(p.eos_seen), p.forwards, sum(done) / len(done) if done else UNKNOWN, p.prompt_len, p.max_tokens,
            p.block_length, *stats, clear, clear / p.masked_in_block if clear >= 0 and p.masked_in_block else UNKNOWN]


TAU, CLEAR, CLEAR_FRAC = FEATURES.index("tau"), FEATURES.index("clear_tau"), FEATURES.index("clear_tau_frac")


def candidate_rows(progress: list[Progress], base: np.ndarray, taus: tuple[float, ...],
                   candidates: tuple[float, ...]) -> np.ndarray:
    """`base` [R, F] (feature_row at any tau) as [R * len(taus), F]: each row at every tau, its tau columns set."""
    n_stats = len(CONFIDENCE_STATS)
    rows = np.repeat(base, len(taus), axis=0)
    rows[:, TAU] = np.tile(taus, len(progress))
    clear = np.full((len(progress), len(taus)), UNKNOWN)
    for i, p in enumerate(progress):
        counts = p.summary[n_stats:]
        if p.summary and len(counts) == len(candidates):
            clear[i] = [counts[candidates.index(t)] if t in candidates else UNKNOWN for t in taus]
    masked = np.repeat(base[:, FEATURES.index("masked_in_block")], len(taus))
    clear = clear.ravel()
    rows[:, CLEAR] = clear
    rows[:, CLEAR_FRAC] = np.where((clear >= 0) & (masked > 0), clear / np.maximum(masked, 1), UNKNOWN)
    return rows
