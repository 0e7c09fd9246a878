"""Training rows and the training-time probe of the demo tasks (dllm_server.demo_tasks), for
scripts/train_demo.py (demo model v3).

A task row is built exactly as a chat row: the chat-template prompt, the answer, <|eot_id|>, then
<|endoftext|> padding to the row's length; maskable from the answer's start (LLaDA's SFT), so the
model learns the answer, where it ends and that the rest is padding. Rows are drawn fresh every
step from their own seeded RNG (saved with the training state); any question of the shipped
evaluation set is skipped by its hash.

The probe (history.json "tasks"): for fixed rows of the evaluation set with the whole answer
region masked, the first forward's answer cross-entropy per token and the share of answer tokens
(the answer and its <|eot_id|>) whose argmax is right with probability >= 0.9 and >= 0.5: a cheap
sign of "parallel-decodable" long before a full decoding evaluation.
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F

import demo_data as D

from dllm_server import demo_tasks as T
from dllm_server.model.attention import DenseBatch

# Computed tasks get more rows: their carries, borrows and ranks take longer to learn; copy too
# (from step 290 of the v3 run): its first-forward argmax was right on 0.07 of answer tokens at
# step 200 and 0.33 at 2500 of an earlier run, the slowest of the seven (its answer sits at an
# offset from the line that depends on the line's length, a two-hop position lookup).
TASK_WEIGHTS = {"copy": 2.0, "reverse": 1.2, "count": 1.0, "lookup": 1.2, "add": 2.2, "subtract": 2.2, "sort": 1.8}


class TaskRows:
    def __init__(self, tok, train_texts: list[str], ids: dict[str, int], seed: int,
                 excluded: set[str], weights: dict[str, float] | None = None):
        self.tok = tok
        self.lines = T.copy_lines(train_texts)
        self.eot, self.eos = ids["<|eot_id|>"], ids["<|endoftext|>"]
        self.excluded = excluded
        w = weights or TASK_WEIGHTS
        self.tasks, self.weights = list(w), list(w.values())
        self.rng = random.Random(seed * 7919 + 17)
        self.skipped = 0

    def draw(self) -> T.TaskItem:
        while True:
            item = T.make(self.rng.choices(self.tasks, self.weights)[0], self.rng, self.lines)
            if T.question_key(item.question) not in self.excluded:
                return item
            self.skipped += 1

    def batch(self, n: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows, maskable, loss denominators): each row's loss is normalised by its answer's
        length with its <|eot_id|> (not by its maskable length, which is mostly padding: that
        would cut the answer tokens' share of the gradient about six-fold)."""
        items = [self.draw() for _ in range(n)]
        x, maskable = build_rows(self.tok, items, seq_len, self.eot, self.eos)
        return x, maskable, answer_mask(x, maskable, self.eot).sum(dim=1).float()


def answer_mask(x: torch.Tensor, maskable: torch.Tensor, eot: int) -> torch.Tensor:
    """The answer's tokens and its <|eot_id|> (the maskable positions up to the first eot)."""
    is_eot = (x == eot) & maskable
    return maskable & (torch.cumsum(is_eot, dim=1) - is_eot.long() == 0)


def build_rows(tok, items: list[T.TaskItem], seq_len: int, eot: int, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token rows, maskable) for `items`, each padded to `seq_len` (or to the longest row)."""
    prompts = tok.encode_batch([D.render_chat([("user", i.question)]) for i in items])
    answers = tok.encode_batch([i.answer for i in items])
    # the batch's rows share one length: seq_len, or the longest row's when one needs more
    seq_len = max([seq_len] + [len(p.ids) + len(a.ids) + 1 for p, a in zip(prompts, answers)])
    xs, ms = [], []
    for p, a in zip(prompts, answers):
        p, a = p.ids, a.ids
        xs.append(p + a + [eot] + [eos] * (seq_len - len(p) - len(a) - 1))
        ms.append([False] * len(p) + [True] * (seq_len - len(p)))
    return torch.tensor(xs, dtype=torch.int64), torch.tensor(ms, dtype=torch.bool)


class TaskProbe:
    """First-forward figures per task on PER_TASK fixed items of the evaluation set."""
    PER_TASK, SEQ_LEN = 16, 96

    def __init__(self, tok, ids: dict[str, int]):
        eot, eos = ids["<|eot_id|>"], ids["<|endoftext|>"]
        self.rows = {}
        for task in T.TASKS:
            items = T.load_eval(tasks=[task], per_task=self.PER_TASK)
            x, maskable = build_rows(tok, items, self.SEQ_LEN, eot, eos)
            self.rows[task] = (x, maskable, answer_mask(x, maskable, eot))

    def figures(self, model, mask_id: int) -> dict[str, dict[str, float]]:
        out = {}
        dev = next(model.parameters()).device
        with torch.inference_mode():
            for task, (x, maskable, answer) in self.rows.items():
                b, length = x.shape
                fed = torch.where(maskable, torch.full_like(x, mask_id), x).reshape(-1)
                rows = answer.reshape(-1).nonzero().squeeze(1)
                logits = model(fed.to(dev), torch.arange(length, device=dev).repeat(b), DenseBatch(b), None,
                               rows.to(dev)).float().cpu()
                target = x.reshape(-1)[rows]
                probs = logits.softmax(-1)
                p_best, best = probs.max(-1)
                right = best == target
                out[task] = {"ce": round(float(F.cross_entropy(logits, target)), 4),
                             "right_p90": round(float((right & (p_best >= 0.9)).float().mean()), 4),
                             "right_p50": round(float((right & (p_best >= 0.5)).float().mean()), 4),
                             "argmax_right": round(float(right.float().mean()), 4)}
        return out


def excluded_keys() -> set[str]:
    return {T.question_key(i.question) for i in T.load_eval()}
