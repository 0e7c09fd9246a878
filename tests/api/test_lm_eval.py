"""lm-evaluation-harness itself (pinned in the test extra), unchanged, against `dllm-server serve`
with the demo model: `local-completions` (it probes /tokenizer_info, sends token-id prompts and no
model name, its stop sequences and seed) and `local-chat-completions` on a tiny local generation
task; both finish with no failed request and a score; and the same task in-process through the
offline API (scripts/lm_eval_offline.py) gives the served answers exactly."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import start_server

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (the test or eval extra)")
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
# Prompts the demo model (v3) continues before a blank line (the task's stop): after a speaker's
# name alone ("ROMEO.") it starts a new paragraph at once, an empty answer that would hide a lost
# reply, so every prompt here is a line already begun.
DOCS = [("ROMEO. But soft,", "what light"), ("HAMLET. To be,", "or not to be"), ("Now is the winter", "of our"),
        ("The king is", "dead"), ("Good morrow,", "my lord"), ("What news, my", "lord")]
TASK = """task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 24
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
metadata:
  version: 1.0
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("lm-eval-task")
    (d / "tiny.jsonl").write_text("".join(json.dumps({"prompt": p, "target": t}) + "\n" for p, t in DOCS))
    (d / "tiny_gen.yaml").write_text(TASK.format(data=d / "tiny.jsonl"))
    return d


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    s = start_server(None, "--block-length", "8", tmp_path=tmp_path_factory.mktemp("lm-eval-server"))
    yield s
    s.stop()


def _harness(model: str, model_args: str, task_dir: Path, out: Path, *extra: str) -> tuple[str, dict, list]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HOME": str(out / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args,
           "--tasks", "tiny_gen", "--include_path", str(task_dir), "--output_path", str(out), "--log_samples", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env, cwd=out)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "API request failed" not in log and "Retry attempt" not in log, log[-5000:]
    (results,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    (samples,) = glob.glob(str(out / "**" / "samples_tiny_gen_*.jsonl"), recursive=True)
    return log, json.loads(Path(results).read_text()), [json.loads(x) for x in Path(samples).read_text().splitlines()]


def _score(results: dict) -> float:
    assert results["n-samples"]["tiny_gen"]["effective"] == len(DOCS)
    return results["results"]["tiny_gen"]["exact_match,none"]


def test_local_completions_and_chat_run_unchanged_and_match_offline(demo_server, task_dir, tmp_path):
    base = demo_server.url
    log, results, samples = _harness(
        "local-completions", f"base_url={base}/v1/completions,num_concurrent=2,max_retries=1", task_dir,
        tmp_path / "completions")
    assert "remote tokenizer" in log.lower()                   # it found /tokenizer_info and sent token ids
    assert "|tiny_gen|" in log and "exact_match" in log          # the printed result table
    table = [line for line in log.splitlines() if line.startswith("|")]
    print("\n".join(table))                                     # the harness' own result table
    score = _score(results)
    assert 0.0 <= score <= 1.0

    chat_log, chat_results, _ = _harness(
        "local-chat-completions", f"base_url={base}/v1/chat/completions,num_concurrent=2,max_retries=1", task_dir,
        tmp_path / "chat", "--apply_chat_template")
    assert 0.0 <= _score(chat_results) <= 1.0 and "exact_match" in chat_log

    sys.path.insert(0, str(SCRIPTS))
    try:
        from lm_eval_offline import evaluate
    finally:
        sys.path.remove(str(SCRIPTS))
    offline = evaluate(None, ["tiny_gen"], str(task_dir), {"block_length": 8}, log_samples=True)
    served = {s["doc"]["prompt"]: s["resps"][0][0] for s in samples}
    assert all(served.values()), served                           # real answers, not empty strings
    assert {s["doc"]["prompt"]: s["resps"][0][0] for s in offline["samples"]["tiny_gen"]} == served
    assert offline["results"]["tiny_gen"]["exact_match,none"] == score
