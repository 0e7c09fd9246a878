"""When is a request's visible answer final? (EOS / end-of-turn early stop, length limit.)

The worker asks after every forward, for every row: how many answer positions are still masked,
is the block still open, is the visible answer final. `AnswerMarks` answers from a plain-list
copy of the answer kept beside the canvas tensor and the first masked / first stop positions, so
a step costs what it committed, not a scan of the answer with tensor ops (which cost more than
the forward's host work on small rows; the request side's RequestState works the same way).
"""
from __future__ import annotations

import torch


class AnswerMarks:
    """One canvas's answer as the stop rule sees it. Every write to the canvas goes through
    `commit`, which writes the tensor (through a NumPy view: the same memory) and the list.

    The visible answer ends at the first committed stop token (exclusive, unless ignore_eos),
    capped at max_tokens; it is final when no position in it is masked: later blocks are skipped
    (dInfer-style early stop, made exact)."""
    __slots__ = ("canvas", "prompt_len", "answer", "mask_id", "stops", "num_masked", "first_mask", "first_stop")

    def __init__(self, canvas: torch.Tensor, prompt_len: int, mask_id: int, stop_ids, ignore_eos: bool):
        self.canvas = canvas.numpy()                   # host tensor: writes land in its memory
        self.prompt_len = prompt_len
        self.answer: list[int] = self.canvas[prompt_len:].tolist()
        self.mask_id = mask_id
        self.stops = frozenset(() if ignore_eos else stop_ids)
        self.num_masked = self.answer.count(mask_id)   # masked answer positions
        self.first_mask = self._next_mask(0)           # no mask in answer[:first_mask]
        self.first_stop = self._next_stop(0)           # no stop token in answer[:first_stop]

    def _next_mask(self, i: int) -> int:
        try:
            return self.answer.index(self.mask_id, i)
        except ValueError:
            return len(self.answer)

    def _next_stop(self, i: int) -> int:
        ans, best = self.answer, len(self.answer)
        for s in self.stops:
            try:
                best = min(best, ans.index(s, i))
            except ValueError:
                pass
        return best

    def commit(self, start: int, cols: list[int], values: list[int]) -> tuple[int, ...]:
        """Write `values` at block-relative columns `cols` of the block starting at canvas
        position `start`; returns the absolute positions written."""
        canvas, ans, mask, stops = self.canvas, self.answer, self.mask_id, self.stops
        base, pl = start - self.prompt_len, self.prompt_len
        changed = 0                                     # masked positions added (+) or filled (-)
        for c, v in zip(cols, values):
            a = base + c
            canvas[pl + a] = v
            old, ans[a] = ans[a], v
            if v == mask:
                if old != mask:
                    changed += 1
                if a < self.first_mask:
                    self.first_mask = a
            elif old == mask:
                changed -= 1
            if v in stops and a < self.first_stop:
                self.first_stop = a
        self.num_masked += changed
        n = len(ans)
        if self.first_mask < n and ans[self.first_mask] != mask:
            self.first_mask = self._next_mask(self.first_mask)
        if self.first_stop < n and ans[self.first_stop] not in stops:     # a stop token overwritten
            self.first_stop = self._next_stop(self.first_stop)
        return tuple([start + c for c in cols])

    def visible_len(self, max_tokens: int) -> int:
        """Up to the first committed stop token (exclusive), capped at max_tokens."""
        return self.first_stop if self.first_stop < max_tokens else min(max_tokens, len(self.answer))

    def is_final(self, max_tokens: int) -> bool:
        """True when nothing the client can see is still masked."""
        return self.first_mask >= self.visible_len(max_tokens)

    def any_masked(self, start: int, end: int) -> bool:
        """Is a position of canvas[start:end] (in the answer) still masked?"""
        # a block-causal family's first block starts inside the prompt: only its answer part counts
        a, b = max(0, start - self.prompt_len), min(end - self.prompt_len, len(self.answer))
        if self.first_mask >= b:
            return False
        if self.first_mask >= a:
            return True
        return self.mask_id in self.answer[a:b]
