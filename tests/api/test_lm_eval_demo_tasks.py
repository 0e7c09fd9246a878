"""The shipped lm-eval task folder (`dllm_demo`, assets/eval/lm_eval/) on the demo model, unchanged
harness: through `dllm-server serve` with `local-chat-completions --apply_chat_template
--gen_kwargs threshold=0.7` every document of every task is scored with no failed request, the
threshold reaches the server (every block of those requests ran at 0.7: the server's
dllm:block_threshold histogram), and the same folder in-process through scripts/lm_eval_offline.py
gives the served answers exactly, with the threshold in every offline request too. The embedded
model (v3) was trained on these tasks: at 0.7 it answers at least 3 in 4 of these documents right
(94 % over the whole evaluation set, its model card)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dllm_server.demo_tasks import TASKS, is_correct, lm_eval_task_dir, load_eval

from .conftest import start_server

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (the test or eval extra)")
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
LIMIT = 3                    # documents per task
THRESHOLD = 0.7              # not the server's default (0.9), so a dropped field shows
SERVED_NAME = "demo"
NAMES = [f"dllm_demo_{t}" for t in TASKS]


def _offline_module():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import lm_eval_offline
    finally:
        sys.path.remove(str(SCRIPTS))
    return lm_eval_offline


def _threshold_histogram(url: str) -> dict[str, float]:
    """dllm:block_threshold's cumulative bucket counts by `le`, plus `_sum` and `_count` (all 0
    before the first labelled observation, when the series is not yet exported)."""
    out = dict.fromkeys(["0.6", "0.7", "sum", "count"], 0.0)
    for line in httpx.get(url + "/metrics", timeout=30, trust_env=False).text.splitlines():
        if line.startswith("dllm:block_threshold_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[le] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(("dllm:block_threshold_sum{", "dllm:block_threshold_count{")):
            out[line.split("{", 1)[0].rsplit("_", 1)[1]] = float(line.rsplit(" ", 1)[1])
    return out


def _served_run(url: str, out: Path) -> tuple[str, dict, dict[str, list[dict]]]:
    """The documented command line, plus --limit and --log_samples."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HOME": str(out / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-chat-completions", "--model_args",
           f"base_url={url}/v1/chat/completions,model={SERVED_NAME},num_concurrent=4,max_retries=1,"
           "tokenized_requests=False", "--apply_chat_template", "--include_path", str(lm_eval_task_dir()),
           "--tasks", "dllm_demo", "--gen_kwargs", f"threshold={THRESHOLD}", "--limit", str(LIMIT),
           "--output_path", str(out), "--log_samples"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=out)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "API request failed" not in log and "Retry attempt" not in log, log[-5000:]
    (results,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    samples = {}
    for name in NAMES:
        (path,) = glob.glob(str(out / "**" / f"samples_{name}_*.jsonl"), recursive=True)
        samples[name] = [json.loads(x) for x in Path(path).read_text().splitlines()]
    return log, json.loads(Path(results).read_text()), samples


def _answers(samples: list[dict]) -> dict[int, str]:
    return {s["doc_id"]: s["resps"][0][0] for s in samples}


def test_request_body_carries_every_sampling_field():
    """What the harness spreads into the body reaches SamplingParams offline, as in the server."""
    m = _offline_module()
    kw = {"until": ["<|eot_id|>"], "max_gen_toks": 64, "do_sample": False, "temperature": 0.0, "threshold": 0.3,
          "slo_ms": 500, "block_length": 8, "top_k": 5, "entropy_bound": 0.5, "not_a_field": 1}
    req = m.DiffusionFields.model_validate_json(json.dumps(m.request_body(kw, chat=True)))
    p = req.sampling_params(256, {})
    assert (p.threshold, p.slo_ms, p.block_length, p.top_k, p.entropy_bound) == (0.3, 500.0, 8, 5, 0.5)
    assert (p.max_tokens, p.temperature, p.stop, p.seed) == (64, 0.0, ("<|eot_id|>",), m.HARNESS_SEED)
    assert req.ignored_fields() == ["not_a_field"]          # logged and ignored, as the server does


def test_shipped_folder_served_and_offline_score_every_doc_with_the_same_answers(tmp_path, monkeypatch):
    server = start_server(None, "--served-model-name", SERVED_NAME, tmp_path=tmp_path)
    try:
        before = _threshold_histogram(server.url)
        log, results, samples = _served_run(server.url, tmp_path / "served")
        after = _threshold_histogram(server.url)
    finally:
        server.stop()
    print("\n".join(line for line in log.splitlines() if line.startswith("|")))    # the harness' own table

    # every document of every task scored, its own reference beside it
    refs = {t: load_eval(tasks=[t], per_task=LIMIT) for t in TASKS}
    for t, name in zip(TASKS, NAMES):
        assert results["n-samples"][name]["effective"] == LIMIT, name
        assert 0.0 <= results["results"][name]["exact_match,none"] <= 1.0
        assert sorted(_answers(samples[name])) == list(range(LIMIT))
        for s in samples[name]:
            assert s["doc"]["answer"] == refs[t][s["doc_id"]].answer and s["target"] == s["doc"]["answer"]
            assert s["exact_match"] == float(is_correct(s["resps"][0][0], s["doc"]["answer"]))
            assert s["arguments"]["gen_args_0"]["arg_1"]["threshold"] == THRESHOLD
    assert "dllm_demo" in results["results"] and results["n-samples"].keys() >= set(NAMES)

    # the threshold reached the server: every block of these requests ran at 0.7
    blocks = after["count"] - before["count"]
    assert blocks >= LIMIT * len(TASKS)
    assert after["0.7"] - before["0.7"] == blocks and after["0.6"] - before["0.6"] == 0
    assert (after["sum"] - before["sum"]) / blocks == pytest.approx(THRESHOLD)

    # the same folder offline: the same answers, the threshold in every request
    m = _offline_module()
    seen = []
    request = m.OfflineLM._request
    monkeypatch.setattr(m.OfflineLM, "_request", lambda self, *a: seen.append(r := request(self, *a)) or r)
    offline = m.evaluate(None, ["dllm_demo"], str(lm_eval_task_dir()), {}, limit=LIMIT, apply_chat_template=True,
                         gen_kwargs=f"threshold={THRESHOLD}", log_samples=True)
    assert len(seen) == LIMIT * len(TASKS)
    assert all(p.threshold == THRESHOLD and p.max_tokens == 64 and p.stop == ("<|eot_id|>",) for _, p, _ in seen)
    for name in NAMES:
        assert _answers(offline["samples"][name]) == _answers(samples[name]), name
        assert offline["results"][name]["exact_match,none"] == results["results"][name]["exact_match,none"]
    assert any(a for name in NAMES for a in _answers(samples[name]).values())    # real answers, not all empty
    pooled = sum(results["results"][name]["exact_match,none"] for name in NAMES) / len(NAMES)
    assert pooled >= 0.75, {name: results["results"][name]["exact_match,none"] for name in NAMES}
