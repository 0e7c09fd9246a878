"""Quality measures reported next to speed figures (bench.decoding, bench.slo, bench.threshold_quality):
token agreement with a threshold-0.99 reference, the model's pseudo log-likelihood, task accuracy."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

import torch

from dllm_server.demo_tasks import is_correct, load_eval
from dllm_server.model.attention import DenseBatch

DEMO = "demo"            # `--task demo`: the shipped evaluation set (assets/eval/demo_tasks.jsonl)


def agreement(answer: list[int], reference: list[int]) -> float:
    """The share of the reference's positions where the answer has the same token; the reference is
    the same request decoded at threshold 0.99, greedy (almost no parallel commits): 1.0 = the
    speed-up changed nothing."""
    if not reference:
        return 1.0 if not answer else 0.0
    same = sum(1 for i, t in enumerate(reference) if i < len(answer) and answer[i] == t)
    return same / max(len(reference), len(answer))


@torch.inference_mode()
def pseudo_log_likelihood(llm, prompt: list[int], answer: list[int], max_positions: int = 128) -> float:
    """Mean over the answer's first `max_positions` positions of log p(token | the rest): one full
    bidirectional forward per position, that position masked, all in one batched forward. Higher is
    better; a lower threshold that commits worse tokens scores lower."""
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
    if str(path) == DEMO:
        return [item.to_json() for item in load_eval()]
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def interleave(task: list[dict]) -> list[dict]:
    """A demo-task file's items round-robin over its tasks (the file is grouped by task, so a run
    shorter than the file still sees every task); a GSM8K-style file keeps its order."""
    if not task or "task" not in task[0]:
        return list(task)
    groups: dict[str, list[dict]] = {}
    for item in task:
        groups.setdefault(item["task"], []).append(item)
    return [g[i] for i in range(max(map(len, groups.values()))) for g in groups.values() if i < len(g)]


def score(answer: str, item: dict) -> bool:
    if "task" in item:
        return is_correct(answer, item["answer"])
    ref = last_number(item["answer"])
    return ref is not None and last_number(answer) == ref


def task_scores(pairs: Iterable[tuple[dict, str | None]]) -> dict:
    """[(item, answer text or None where the request failed)] -> accuracy over every request
    (failures wrong, and counted apart), and the same per task (the item's "task", else "all"). A
    demo-task item (load_task("demo"), the shipped evaluation set) is scored by exact match, a
    GSM8K-style one ({"question", "answer"}) by its last number."""
    counts: dict[str, list[int]] = {}          # task -> [correct, failed, requests]
    for item, answer in pairs:
        c = counts.setdefault(item.get("task", "all"), [0, 0, 0])
        c[2] += 1
        if answer is None:
            c[1] += 1
        elif score(answer, item):
            c[0] += 1

    def entry(correct: int, failed: int, n: int) -> dict:
        return {"accuracy": correct / n if n else None, "correct": correct, "failed": failed, "requests": n}

    total = [sum(c[i] for c in counts.values()) for i in range(3)]
    return {**entry(*total), "per_task": {t: entry(*c) for t, c in counts.items()}}
