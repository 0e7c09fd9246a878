"""When a request's visible answer is final (EOS / end-of-turn early stop, length limit)."""
from __future__ import annotations

import torch


class AnswerMarks:
    """The answer as a plain list (a step costs what it commits, not a tensor scan); all writes go through `commit`."""
    __slots__ = ("canvas", "prompt_len", "answer", "mask_id", "stops", "num_masked", "first_mask", "first_stop")

    def __init__(self, canvas: torch.Tensor, prompt_len: int, mask_id: int, stop_ids, ignore_eos: bool):
        self.canvas = canvas.numpy()                   # host tensor: writes land in its memory
        self.prompt_len = prompt_len
        self.answer: list[int] = self.canvas[prompt_len:].tolist()
        self.mask_id = mask_id
        self.stops = frozenset(() if ignore_eos else stop_ids)
        self.num_masked = self.answer.count(mask_id)
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
        """Write `values` at columns `cols` of the block starting at `start`; returns the positions written."""
        canvas, ans, mask, stops = self.canvas, self.answer, self.mask_id, self.stops
        base, pl = start - self.prompt_len, self.prompt_len
        changed = 0
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
        if self.first_stop < n and ans[self.first_stop] not in stops:
            self.first_stop = self._next_stop(self.first_stop)
        return tuple([start + c for c in cols])

    def visible_len(self, max_tokens: int) -> int:
        return self.first_stop if self.first_stop < max_tokens else min(max_tokens, len(self.answer))

    def is_final(self, max_tokens: int) -> bool:
        return self.first_mask >= self.visible_len(max_tokens)

    def any_masked(self, start: int, end: int) -> bool:
        """Is an answer position of canvas[start:end] still masked (a block-causal block may start in the prompt)?"""
        a, b = max(0, start - self.prompt_len), min(end - self.prompt_len, len(self.answer))
        if self.first_mask >= b:
            return False
        if self.first_mask >= a:
            return True
        return self.mask_id in self.answer[a:b]
