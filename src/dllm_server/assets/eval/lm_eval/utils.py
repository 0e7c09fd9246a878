"""`dllm_demo` lm-eval data (found beside this file: a task YAML names only fixed paths) and scoring."""
from __future__ import annotations

import json
from pathlib import Path

import datasets

try:
    from dllm_server.demo_tasks import is_correct
except ImportError:     # the folder copied out to an environment without dllm-server
    def is_correct(answer: str, reference: str) -> bool:
        return " ".join(answer.split()) == " ".join(reference.split())

EVAL_FILE = Path(__file__).resolve().parent.parent / "demo_tasks.jsonl"


def load_docs(task: str, **_) -> datasets.DatasetDict:
    rows = [json.loads(line) for line in EVAL_FILE.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["task"] == task]
    if not rows:
        raise ValueError(f"{EVAL_FILE} has no records of task {task!r}")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"exact_match": float(is_correct(results[0], doc["answer"]))}
