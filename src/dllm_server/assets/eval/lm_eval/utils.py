"""Data and scoring of the `dllm_demo` lm-evaluation-harness tasks (this folder's YAML files).

The documents are the shipped evaluation set, `../demo_tasks.jsonl`, found next to this file so the
folder works wherever the package is installed (a task YAML can only name a fixed `data_files`
path); each task keeps its own records. Scoring is `dllm_server.demo_tasks.is_correct`: equality
after stripping and collapsing whitespace.
"""
from __future__ import annotations

import json
from pathlib import Path

import datasets

try:
    from dllm_server.demo_tasks import is_correct
except ImportError:     # the harness in an environment without dllm-server (the folder copied out)
    def is_correct(answer: str, reference: str) -> bool:
        return " ".join(answer.split()) == " ".join(reference.split())

EVAL_FILE = Path(__file__).resolve().parent.parent / "demo_tasks.jsonl"


def load_docs(task: str, **_) -> datasets.DatasetDict:
    """`custom_dataset`: the records of one demo task as the `test` split. The harness also passes
    the task's metadata and the model's arguments as keywords; they are not needed here."""
    rows = [json.loads(line) for line in EVAL_FILE.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["task"] == task]
    if not rows:
        raise ValueError(f"{EVAL_FILE} has no records of task {task!r}")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    return {"exact_match": float(is_correct(results[0], doc["answer"]))}
