"""SLO-aware decoding on the real server: a tight SLO decodes with lower thresholds (fewer
forwards) than a loose one, and each is token-identical to the offline API given the same
per-block thresholds; the response reports the thresholds and whether the SLO was met."""
import httpx

from dllm_server import LLM, SamplingParams
from dllm_server.policy.base import ThresholdSchedule

from .conftest import start_server


def test_tight_slo_lowers_thresholds_and_matches_offline(tiny_llada, tmp_path):
    s = start_server(tiny_llada, "--block-length", "8", "--threshold-policy", "slo", tmp_path=tmp_path)
    try:
        body = {"prompt": [5, 6, 7, 8], "max_tokens": 32, "ignore_eos": True, "seed": 3, "temperature": 0.7,
                "return_token_ids": True}
        with httpx.Client(base_url=s.url, timeout=60) as c:
            loose = c.post("/v1/completions", json={**body, "slo_ms": 600_000}).json()["choices"][0]
            tight = c.post("/v1/completions", json={**body, "slo_ms": 1}).json()["choices"][0]
            bad = c.post("/v1/completions", json={**body, "slo_ms": 0})
            explicit = c.post("/v1/completions", json={**body, "slo_ms": 1, "threshold": 0.9}).json()["choices"][0]
        assert bad.status_code == 400 and "slo_ms" in bad.json()["error"]["message"]
        lo, ti = loose["dllm"], tight["dllm"]
        assert lo["thresholds"] == [0.95] * 4 and lo["slo_met"] is True
        assert ti["thresholds"] == [0.5] * 4 and ti["slo_met"] is False      # 1 ms cannot be met: the floor
        assert ti["forwards"] < lo["forwards"]
        assert explicit["dllm"]["thresholds"] == [0.9] * 4                    # an explicit threshold is kept
        for choice in (loose, tight):
            llm_out = LLM(tiny_llada, block_length=8, dtype="float32",
                          policy=ThresholdSchedule(choice["dllm"]["thresholds"])).generate(
                {"prompt_token_ids": body["prompt"]}, SamplingParams(max_tokens=32, ignore_eos=True, seed=3,
                                                                     temperature=0.7))[0]
            assert llm_out.token_ids == choice["token_ids"]
            assert llm_out.stats.num_forwards == choice["dllm"]["forwards"]
    finally:
        s.stop()


def test_on_the_demo_model_a_tight_slo_answers_a_task_in_fewer_forwards(tmp_path):
    """Issue 26's knob, as a user meets it: the embedded demo model (v3), a demo task, no
    ignore_eos. A loose SLO leaves the policy its top candidate (0.95), which commits this sort's
    digits over several forwards; a tight one gets the floor (0.5), which commits them at once.
    Each answer is the offline API's at the thresholds the server reports."""
    s = start_server(None, "--threshold-policy", "slo", tmp_path=tmp_path)
    question = "Sort: 36 35 17 99 46 45"
    try:
        body = {"messages": [{"role": "user", "content": question}], "max_tokens": 64, "temperature": 0.0}
        with httpx.Client(base_url=s.url, timeout=120) as c:
            loose = c.post("/v1/chat/completions", json={**body, "slo_ms": 600_000}).json()["choices"][0]
            tight = c.post("/v1/chat/completions", json={**body, "slo_ms": 1}).json()["choices"][0]
        lo, ti = loose["dllm"], tight["dllm"]
        assert lo["thresholds"][0] == 0.95 and ti["thresholds"][0] == 0.5, (lo, ti)
        assert ti["forwards"] < lo["forwards"], (lo, ti)
        assert loose["finish_reason"] == tight["finish_reason"] == "stop"
        llm = LLM(dtype="float32")
        for choice in (loose, tight):
            out = llm.chat([[{"role": "user", "content": question}]], SamplingParams(
                max_tokens=64, temperature=0.0, threshold=choice["dllm"]["thresholds"][0]))[0]
            assert out.text == choice["message"]["content"]
            assert out.stats.num_forwards == choice["dllm"]["forwards"]
    finally:
        s.stop()
