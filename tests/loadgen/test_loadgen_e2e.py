"""End to end: the CLI against an independent OpenAI-style echo server on 127.0.0.1."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.cli import main
from loadgen_echo_server import EchoServer, EchoState

REPO = Path(__file__).resolve().parents[2]


def run_cli(tmp_path: Path, url: str, *flags: str, name: str = "out.json") -> dict:
    out = tmp_path / name
    rc = main(["--base-url", url, "--no-progress", "--quiet", "--result-dir", str(tmp_path),
               "--result-file", str(out), *flags])
    assert rc == 0
    return json.loads(out.read_text())


def check_arrays(res: dict, n: int) -> None:
    req = res["requests"]
    for key in ("ok", "start_times", "ttfts", "itls", "latencies", "output_lens", "errors",
                "texts", "tpots", "usage_output_tokens", "client_output_tokens", "prompt_lens"):
        assert len(req[key]) == n, key


def test_help_runs_from_repo_root():
    out = subprocess.run([sys.executable, "-m", "loadgen", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--goodput" in out.stdout and "--rates" in out.stdout


def test_completions_run(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    state = EchoState(first_delay=0.05)
    with EchoServer(state) as srv:
        res = run_cli(tmp_path, srv.url, "--num-prompts", "10", "--num-warmups", "2",
                      "--request-rate", "25", "--seed", "3", "--dataset", "synthetic",
                      "--length-scale", "0.02", "--output-len", "6", "--ignore-eos",
                      "--extra-body", '{"threshold": 0.9, "block_length": 4}',
                      "--goodput", "ttft:5000", "tpot:1000", "--metadata", "run=e2e", "gpu=none")
    s, req = res["summary"], res["requests"]
    assert (s["num_requests"], s["completed"], s["failed"]) == (10, 10, 0)
    check_arrays(res, 10)
    assert state.requests == 12                       # 2 warm-ups went to the server...
    assert res["server_metrics"]["available"]         # ...but not into the deltas
    deltas = res["server_metrics"]["deltas"]
    assert deltas["dllm:requests_total"] == 10.0
    assert deltas['dllm:generation_tokens_total{model="echo-model"}'] == 60.0
    assert not any(k.startswith(("other", "dllm:running")) for k in deltas)
    for ttft, lat, itls, text in zip(req["ttfts"], req["latencies"], req["itls"], req["texts"]):
        assert 0.045 <= ttft <= lat                  # the progress chunk at t~0 is not TTFT
        assert len(itls) == 5                         # 6 content chunks; progress chunks skipped
        assert text == "w0 w1 w2 w3 w4 w5 "
    assert req["usage_output_tokens"] == [6] * 10 and req["output_lens"] == [6] * 10
    assert all(p == 2 for p in req["progress_chunks"]) and s["progress_chunks"] == 20
    assert s["total_output_tokens"] == 60 and s["token_mismatches"] == 0
    assert s["ttft_ms"]["count"] == 10 and s["inter_chunk_ms"]["count"] == 50
    assert s["goodput"]["good_requests"] == 10 and s["peak_output_throughput"] > 0
    assert s["peak_concurrency"] >= 1 and s["achieved_concurrency"] > 0
    starts = req["start_times"]
    assert starts == sorted(starts) and 0.05 < starts[-1] < 3.0   # Poisson at 25 req/s
    cfg = res["config"]
    assert cfg["model"] == "echo-model" and cfg["request_rate"] == "25" and cfg["seed"] == 3
    assert cfg["dllm_params"] == {"threshold": 0.9, "block_length": 4}
    assert res["server"]["version"] == {"version": "echo-0.1"}
    assert res["metadata"] == {"run": "e2e", "gpu": "none"}
    assert res["machine"]["cpu_count"] >= 1
    body = state.bodies[-1]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["threshold"] == 0.9 and body["max_tokens"] == 6
    assert body["model"] == "echo-model" and isinstance(body["prompt"], str)
    assert set(state.auth) == {"Bearer sk-from-env"}


def test_chat_closed_loop_and_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(100)} | {"[UNK]": 100},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    state = EchoState(first_delay=0.02, usage_offset=1)    # server over-reports by one token
    with EchoServer(state) as srv:
        res = run_cli(tmp_path, srv.url, "--endpoint", "chat", "--dataset", "arxiv-mix",
                      "--length-scale", "0.01", "--output-len", "4", "--num-prompts", "6",
                      "--max-concurrency", "2", "--api-key", "k1",
                      "--tokenizer", str(tmp_path / "tokenizer.json"))
    s, req = res["summary"], res["requests"]
    assert s["completed"] == 6 and s["peak_concurrency"] <= 2
    assert all(len(itls) == 3 for itls in req["itls"])    # role chunk with "" is not content
    assert req["client_output_tokens"] == [4] * 6 and req["usage_output_tokens"] == [5] * 6
    assert s["token_mismatches"] == 6 and all(req["token_mismatch"])
    assert s["token_count_method"].startswith("tokenizer:")
    assert "messages" in state.bodies[0] and set(state.auth) == {"Bearer k1"}


def test_random_ids_prompts(tmp_path):
    state = EchoState(first_delay=0.0, chunk_delay=0.0)
    with EchoServer(state) as srv:
        res = run_cli(tmp_path, srv.url, "--dataset", "random", "--vocab-size", "500",
                      "--id-low", "100", "--prompt-len", "12", "--output-len", "3",
                      "--num-prompts", "5")
    assert res["summary"]["completed"] == 5
    for body in state.bodies:
        assert isinstance(body["prompt"], list) and all(100 <= t < 500 for t in body["prompt"])
    # usage prompt tokens come back from the server and feed the input-token total
    assert res["summary"]["total_input_tokens"] == sum(len(b["prompt"]) for b in state.bodies)


def test_server_errors_are_counted_with_messages(tmp_path):
    state = EchoState(first_delay=0.0, fail_every=3, stream_error_every=4, send_metrics=False)
    with EchoServer(state) as srv:
        res = run_cli(tmp_path, srv.url, "--num-prompts", "12", "--output-len", "5",
                      "--length-scale", "0.01", "--goodput", "e2el:60000")
    s, req = res["summary"], res["requests"]
    check_arrays(res, 12)
    # requests 3,6,9,12 -> HTTP 400; 4,8 -> error event mid-stream (server counts in arrival order)
    assert s["failed"] == 6 and s["completed"] == 6 and res["errors"]["count"] == 6
    msgs = {e["message"]: e["count"] for e in res["errors"]["first_distinct"]}
    assert msgs == {"HTTP 400: prompt too long: 9999 > 4096 tokens": 4,
                    "stream error: worker 0 died": 2}
    failed = [i for i, ok in enumerate(req["ok"]) if not ok]
    assert all(req["errors"][i] for i in failed) and all(req["ttfts"][i] is None or
                                                         req["errors"][i].startswith("stream")
                                                         for i in failed)
    assert s["goodput"]["good_requests"] == 6 and s["goodput"]["fraction"] == 0.5
    assert not res["server_metrics"]["available"]
    assert "404" in res["server_metrics"]["note"]


def test_unreachable_server_fails_every_request(tmp_path):
    with EchoServer() as srv:
        url = srv.url                                      # closed once the block exits
    res = run_cli(tmp_path, url, "--num-prompts", "3", "--output-len", "2", "--timeout", "5")
    assert res["summary"]["failed"] == 3 and res["errors"]["count"] == 3
    assert all(e.startswith("ConnectError") for e in res["requests"]["errors"])
    assert not res["server_metrics"]["available"] and res["config"]["model"] is None


def test_rate_sweep_writes_results_and_plots(tmp_path):
    with EchoServer(EchoState(first_delay=0.01, chunk_delay=0.001)) as srv:
        rc = main(["--base-url", srv.url, "--no-progress", "--quiet", "--result-dir",
                   str(tmp_path), "--rates", "20,40", "--num-prompts", "4", "--output-len", "3",
                   "--length-scale", "0.01", "--label", "sw"])
    assert rc == 0
    sweep = json.loads((tmp_path / "sw-sweep.json").read_text())
    assert [r["rate"] for r in sweep["runs"]] == ["20", "40"]
    for r in sweep["runs"]:
        assert json.loads(Path(r["file"]).read_text())["summary"]["completed"] == 4
    for png in ("sw-latency-vs-rate.png", "sw-latency-cdf.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_capacity_cli_and_trace_replay(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(x) for x in [
        {"timestamp": 100.0, "prompt": "hello there", "output_len": 2},
        {"timestamp": 100.3, "prompt_len": 8, "output_len": 3},
        {"timestamp": 100.6, "prompt_len": 4, "output_len": 2}]))
    with EchoServer(EchoState(first_delay=0.0, chunk_delay=0.001)) as srv:
        rc = main(["--base-url", srv.url, "--no-progress", "--quiet", "--no-plots",
                   "--result-dir", str(tmp_path), "--label", "cap", "--capacity-search",
                   "--goodput", "e2el:30000", "--capacity-start-rate", "50",
                   "--capacity-max-rate", "100", "--num-prompts", "3", "--output-len", "2",
                   "--length-scale", "0.01"])
        assert rc == 0
        res = run_cli(tmp_path, srv.url, "--trace", str(trace), "--trace-speed", "2")
    cap = json.loads((tmp_path / "cap-capacity.json").read_text())
    assert [h["rate"] for h in cap["history"]] == [50.0, 100.0]
    assert cap["capacity"] == 100.0 and not cap["bracketed"]
    assert res["summary"]["completed"] == 3 and res["config"]["request_rate"] == "trace"
    starts = res["requests"]["start_times"]
    assert starts[1] - starts[0] == pytest.approx(0.15, abs=0.1)
    assert starts[2] - starts[0] == pytest.approx(0.30, abs=0.1)
    assert res["requests"]["expected_output_lens"] == [2, 3, 2]


def test_bad_flags_exit_2(tmp_path):
    assert main(["--extra-body", "[1]", "--result-dir", str(tmp_path)]) == 2
    assert main(["--capacity-search", "--result-dir", str(tmp_path)]) == 2
    assert main(["--endpoint", "chat", "--random-ids", "--result-dir", str(tmp_path)]) == 2
