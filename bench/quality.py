"""Quality measures our models can give on this machine, for reporting next to speed figures:

- `agreement(answer, reference)`: the share of the reference's positions where the answer has the
  same token, the reference being the same request decoded at threshold 0.99, greedy (what a
  request would get with almost no parallel commits). 1.0 = the speed-up changed nothing.
- `pseudo_log_likelihood(llm, prompt, answer)`: the model's own mean log-probability of each answer
  token given everything else (one full bidirectional forward per answer position, that position
  masked; all positions of one answer in one batched forward). Higher is better; a lower threshold
  that commits worse tokens scores lower.
- `task_accuracy(answers, task)`: for a GSM8K-style task file (JSONL of {"question", "answer"}),
  the share whose last number equals the reference's (what a GPU run with a real checkpoint uses).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from dllm_server.model.attention import DenseBatch


def agreement(answer: list[int], reference: list[int]) -> float:
    if not reference:
        return 1.0 if not answer else 0.0
    same = sum(1 for i, t in enumerate(reference) if i < len(answer) and answer[i] == t)
    return same / max(len(reference), len(answer))


@torch.inference_mode()
def pseudo_log_likelihood(llm, prompt: list[int], answer: list[int], max_positions: int = 128) -> float:
    """Mean over the answer's first `max_positions` positions of log p(token | the rest)."""
    answer = answer[:max_positions]
    if not answer:
        return 0.0
    model, args = llm.runner.model, llm.args
    canvas = torch.tensor(prompt + answer, dtype=torch.int64)
    n, length = len(answer), canvas.numel()
    rows = canvas.repeat(n, 1)
    where = torch.arange(n) + len(prompt)
    rows[torch.arange(n), where] = args.mask_id
    device = next(model.parameters()).device
    pos = torch.arange(length).repeat(n).to(device)
    # Dream-style models (logit_shift 1) predict token i from the output at i - 1
    at = torch.arange(n) * length + where - args.logit_shift
    logits = model(rows.reshape(-1).to(device), pos, DenseBatch(n), None, at.to(device))
    logp = torch.log_softmax(logits[:, : args.vocab_size].float(), dim=-1)
    return float(logp[torch.arange(n), torch.tensor(answer, device=logp.device)].mean())


_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def load_task(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def task_accuracy(answers: list[str], task: list[dict]) -> float:
    refs = [last_number(t["answer"]) for t in task]
    return sum(1 for a, r in zip(answers, refs) if r is not None and last_number(a) == r) / max(1, len(task))
