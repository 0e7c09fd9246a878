"""Structured output end to end: the committed schemas served over HTTP by the demo model (streamed and not, at
0.9 and 0.5, batched with the same requests unconstrained) and decoded offline by tiny LLaDA, Dream and SDAR
checkpoints; every answer parses and validates. Bad constraints are 400s naming the field, and a schema whose
automaton explodes costs its sender a 400 after the compile limit while the front keeps serving."""
import threading
import time

import httpx
import pytest

from bench.structured import load_schemas, response_format, run, violation
from dllm_server import LLM, SamplingParams, StructuredOutputs
from dllm_server.server_process import serve

ITEMS = load_schemas()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    s = serve(None, "--threads-per-worker", "1", "--structured-compile-timeout-s", "5", log_path=tmp_path_factory.mktemp("structured") / "server.log")
    yield s
    s.stop()


@pytest.mark.parametrize("threshold,stream", [(0.9, False), (0.5, True)])
def test_every_schema_validates_served_batched_with_unconstrained_requests(demo, threshold, stream):
    r = run(demo.url, ITEMS, threshold, stream, max_tokens=128)
    assert r["failures"] == [] and r["valid"] == len(ITEMS) >= 30
    assert r["dp_ms_per_forward"] > 0


@pytest.mark.parametrize("arch", ["llada", "dream", "sdar"])
def test_every_schema_validates_offline_on_tiny_checkpoints(request, arch):
    llm = LLM(request.getfixturevalue(f"tiny_{arch}"), block_length=8, dtype="float64")
    for threshold in (0.9, 0.5):
        constrained = [SamplingParams(max_tokens=96, threshold=threshold, structured_outputs=StructuredOutputs(
            json=it["schema"]) if it["schema"] is not None else StructuredOutputs(json_object=True)) for it in ITEMS]
        plain = [SamplingParams(max_tokens=96, threshold=threshold)] * 4
        outs = llm.generate([{"prompt_token_ids": [5, 9, 14, 3]}] * (len(ITEMS) + 4), constrained + plain)
        bad = [(it["name"], o.text, why) for it, o in zip(ITEMS, outs) if (why := violation(it, o.text))]
        assert bad == [], (arch, threshold, bad)
        assert all(o.stats.constrained_forwards == o.stats.num_forwards for o in outs[: len(ITEMS)])
        assert all(o.stats.constrained_forwards == 0 for o in outs[len(ITEMS):])


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}


@pytest.mark.parametrize("extra,param,says", [
    ({"response_format": response_format({"name": "s", "schema": SCHEMA}), "max_tokens": 2}, "max_tokens",
     "too small"),
    ({"response_format": response_format({"name": "s", "schema": {"type": "array", "uniqueItems": True}})},
     "response_format", "uniqueItems"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, "response_format", "name"),
    ({"response_format": {"type": "yaml"}}, "response_format", ""),
    ({"guided_regex": "(("}, "guided_regex", "cannot be compiled"),
    ({"guided_regex": "(a|b)", "guided_json": SCHEMA}, "guided_regex", "one of"),
    ({"guided_json": SCHEMA, "ignore_eos": True}, "guided_json", "ignore_eos"),
    ({"guided_json": "{oops"}, "guided_json", "not valid JSON"),
])
def test_bad_constraints_are_400s_naming_the_field(demo, extra, param, says):
    r = httpx.post(demo.url + "/v1/chat/completions", json={**CHAT, **extra}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith(param) and says in err["message"], err


def test_completions_take_vllm_extras_too(demo):
    r = httpx.post(demo.url + "/v1/completions", json={"prompt": "Is it? ", "max_tokens": 8,
                                                       "guided_regex": "(yes|no)"}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("yes", "no")


def test_an_exploding_schema_costs_its_sender_a_400_not_the_front(demo):
    out = {}

    def hostile():
        t0 = time.monotonic()
        out["r"] = httpx.post(demo.url + "/v1/chat/completions", json={**CHAT, "guided_regex": "(a|b)*a(a|b){40}"},
                              timeout=60)
        out["s"] = time.monotonic() - t0
    th = threading.Thread(target=hostile)
    th.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    ok = httpx.post(demo.url + "/v1/chat/completions", json={**CHAT, "guided_regex": "(yes|no)"}, timeout=60)
    served_s = time.monotonic() - t0
    th.join()
    assert ok.status_code == 200 and served_s < 8.0, served_s          # answered while the compile runs
    assert out["r"].status_code == 400 and "longer than" in out["r"].json()["error"]["message"]
    assert 4.5 <= out["s"] < 15.0
