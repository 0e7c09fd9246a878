"""Task accuracy in the benchmarks (bench/quality.py, bench/slo.py, bench/threshold_quality.py):
every request is scored against its own reference, carried with its request spec, so a failed
request in the middle shifts no later pair and counts as wrong (and apart); a run shorter than the
file is scored over its own requests; demo-task items by exact match, GSM8K-style ones by their
last number; the demo set mixed with the chat prompts; forwards per answer from the server's
counters."""
from types import SimpleNamespace

import pytest

from bench import quality as Q
from bench import slo as S
from bench import threshold_quality as T
from dllm_server.demo_tasks import TASKS

GSM = [{"question": f"q{i}", "answer": f"so the answer is {i}"} for i in range(5)]
DEMO = [{"task": "add", "question": "What is 1 + 2?", "answer": "Sum: 3"},
        {"task": "sort", "question": "Sort: 3 1 2", "answer": "Sorted: 1 2 3"},
        {"task": "add", "question": "What is 2 + 2?", "answer": "Sum: 4"}]


def _result(texts, ok, deltas=None) -> dict:
    """The parts of a loadgen result that bench/slo.py reads: per-request arrays, in spec order."""
    return {"requests": {"texts": texts, "ok": ok}, "server_metrics": {"deltas": deltas or {}}}


@pytest.fixture
def stub_llm(monkeypatch):
    monkeypatch.setattr(S, "pseudo_log_likelihood", lambda llm, prompt, answer: 0.0)
    tok = SimpleNamespace(hf=SimpleNamespace(encode=lambda text, add_special_tokens: [len(text)]),
                          apply_chat_template=lambda messages: [1])
    return SimpleNamespace(tokenizer=tok)


def test_a_failed_request_in_the_middle_shifts_no_later_pair(stub_llm):
    specs = S.task_workload(GSM, 5, 32)
    refs = {s.prompt: [0] for s in specs}
    texts = [f"it is {i}" for i in range(5)]
    texts[2] = ""                                         # request 2 failed: no text
    q = S.quality(stub_llm, _result(texts, [True, True, False, True, True]), specs, refs)["task"]
    assert (q["correct"], q["failed"], q["requests"], q["accuracy"]) == (4, 1, 5, 0.8)
    # the positional pairing this replaces: the successful answers zipped with the file's lines
    old = [t for t, ok in zip(texts, [True, True, False, True, True]) if ok]
    assert sum(Q.last_number(a) == Q.last_number(t["answer"]) for a, t in zip(old, GSM)) == 2


def test_a_run_shorter_than_the_file_is_scored_over_its_requests(stub_llm):
    specs = S.task_workload(GSM, 2, 32)
    q = S.quality(stub_llm, _result(["0", "1"], [True, True]), specs, {s.prompt: [0] for s in specs})["task"]
    assert (q["accuracy"], q["requests"]) == (1.0, 2)          # not 2 of the file's 5


def test_demo_items_exact_match_gsm8k_last_number_per_task():
    assert Q.score("Sum:   3 ", DEMO[0]) and not Q.score("Sum: 3.", DEMO[0])
    assert not Q.score("3", DEMO[0])                         # a demo answer is the whole answer
    assert Q.score("... 4 apples, so 1,234", {"question": "", "answer": "#### 1234"})
    assert not Q.score("4", {"question": "", "answer": "no number"})    # as before: no reference number
    s = Q.task_scores([(DEMO[0], "Sum: 3"), (DEMO[1], None), (DEMO[2], "Sum: 5")])
    assert (s["accuracy"], s["failed"], s["requests"]) == (pytest.approx(1 / 3), 1, 3)
    assert s["per_task"]["add"] == {"accuracy": 0.5, "correct": 1, "failed": 0, "requests": 2}
    assert s["per_task"]["sort"] == {"accuracy": 0.0, "correct": 0, "failed": 1, "requests": 1}
    assert Q.task_scores([])["accuracy"] is None


def test_demo_set_interleaved_and_mixed_with_the_chat_prompts():
    demo = Q.load_task("demo")
    assert len(demo) == 210 and {d["task"] for d in demo} == set(TASKS)
    assert [d["task"] for d in Q.interleave(demo)[: len(TASKS)]] == list(TASKS)    # every task early
    assert Q.interleave(GSM) == GSM                                                 # file order kept
    specs = S.task_workload(demo, 40, 64, share=0.8, seed=3)
    on_task = [s for s in specs if "item" in s.meta]
    assert len(specs) == 40 and len(on_task) == 32
    assert all(s.prompt == s.meta["item"]["question"] for s in on_task)
    assert all(s.prompt in S.PROMPTS for s in specs if "item" not in s.meta)
    assert S.task_workload(demo, 40, 64, share=0.8, seed=3) == specs               # seeded
    # share 1 keeps today's order for a GSM8K-style file: item i % len
    assert [s.prompt for s in S.task_workload(GSM, 7, 64)] == [GSM[i % 5]["question"] for i in range(7)]


def test_mixed_run_scores_only_task_requests_and_reads_forwards(stub_llm):
    specs = S.task_workload(DEMO, 6, 32, share=0.5, seed=0)
    texts = [s.meta["item"]["answer"] if "item" in s.meta else "chat" for s in specs]
    ok = [True] * 6
    first_task = next(i for i, s in enumerate(specs) if "item" in s.meta)
    ok[first_task] = False
    deltas = {'dllm:denoising_steps_total{model_name="m"}': 60.0,
              'dllm:request_success_total{finished_reason="stop",model_name="m"}': 4.0,
              'dllm:request_success_total{finished_reason="length",model_name="m"}': 1.0}
    q = S.quality(stub_llm, _result(texts, ok, deltas), specs, {s.prompt: [0] for s in specs})
    assert (q["task"]["correct"], q["task"]["failed"], q["task"]["requests"]) == (2, 1, 3)
    assert q["forwards_per_answer"] == 12.0
    assert S.forwards_per_answer(_result([], [])) is None


def test_threshold_quality_limit_is_per_task():
    demo = Q.load_task("demo")
    kept = T.first(demo, 2)
    assert len(kept) == 2 * len(TASKS) and T.first(GSM, 2) == GSM[:2] and T.first(GSM, None) == GSM


def test_slo_tables_show_accuracy_failures_per_task_and_forwards(capsys):
    q = {"agreement": 0.9, "pll": -2.0, "forwards_per_answer": 12.5,
         "task": Q.task_scores([(DEMO[0], "Sum: 3"), (DEMO[1], None)])}
    run = {"multiple": 1.0, "rate": 2.0, "quality": q,
           "result": {"summary": {"slo": {"attainment": 0.95, "mean_threshold": 0.85},
                                  "e2el_ms": {"mean": 100.0, "p99": 300.0}}}}
    rep = {"model": "m", "requests_per_rate": 2, "max_tokens": 64, "slo_ms": 400.0, "unloaded_ms": 130.0,
           "capacity_fixed_0.9": 2.0, "task": "demo", "task_share": 0.8,
           "configs": {"fixed 0.9": {"runs": [run], "tick_s": 1e-4, "server": {"dllm:step_time_rel_error": 0.1}},
                       "slo + load control": {"runs": [run], "tick_s": None,
                                              "server": {"dllm:step_time_rel_error": 0.05}}}}
    S.print_tables(rep)
    out = capsys.readouterr().out
    assert "| fixed 0.9 | 1x | 2.00 | 95 % | 100 | 300 | 0.850 | 0.900 | -2.000 | 12.5 | 0.500 | 1/2 |" in out
    assert "| config | load | add | sort |" in out and "| fixed 0.9 | 1x | 1.00 (1) | 0.00 (1) |" in out
