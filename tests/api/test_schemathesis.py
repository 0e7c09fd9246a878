"""Property-based fuzzing of the whole API from its /openapi.json, positive and negative data,
every check (positive-data acceptance included): no 5xx, responses conform to the documented
schema, schema-violating requests are rejected and schema-valid ones accepted. The schema carries
the served model's bounds (context, vocabulary, mask id); the two rules JSON Schema cannot state
(a prompt's token count against max_tokens, steps against the answer length) are documented in
the schema and applied by schemathesis_hooks.py. The server runs the SLO threshold policy, so
slo_ms steers decoding, and a model with a short context keeps each request cheap."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_server.model.tiny import make_tiny_model

from .conftest import start_server

BIN = Path(sys.executable).parent / "st"
# 60 examples an operation and run: two runs (120, the suite's time budget); the issue's own command
# (120 examples, seeds 1, 2 and 3) is in README.md ("Talk to it") with its result
MAX_LEN, BLOCK, CHAT_MAX, EXAMPLES = 192, 8, 24, 60


@pytest.fixture(scope="module")
def st_server(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory.mktemp("st-model"), arch="llada", seed=3, max_len=MAX_LEN)
    s = start_server(str(model), "--block-length", str(BLOCK), "--served-model-name", "tiny", "--threshold-policy",
                     "slo", "--default-chat-max-tokens", str(CHAT_MAX), "--max-waiting-requests", "100000",
                     tmp_path=tmp_path_factory.mktemp("st-server"))
    yield s
    s.stop()


@pytest.mark.parametrize("seed", [None, 101], ids=["derandomized", "seed101"])
def test_schemathesis_finds_nothing(st_server, tmp_path, seed):
    """Derandomized (the same cases every run) and a seeded run: other seeds find other classes of
    requests (the steps range was found by a seed the derandomized run never generates)."""
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks", "DLLM_ST_SERVER": st_server.url,
           "DLLM_ST_MAX_LEN": str(MAX_LEN), "DLLM_ST_BLOCK": str(BLOCK), "DLLM_ST_CHAT_MAX": str(CHAT_MAX),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [str(BIN), "run", st_server.url + "/openapi.json", "--mode", "all", "--max-examples", str(EXAMPLES),
           "--phases", "examples,coverage,fuzzing", "--checks", "all", "--request-timeout", "120",
           # the largest valid request (n up to 128 of 2 prompts) is real work on 2 busy cores: a hang
           # bound, not a latency target (the default 10 s failed on one n=116 completion)
           "--max-response-time", "90",
           "--output-sanitize", "false"] + (["--generation-deterministic"] if seed is None else ["--seed", str(seed)])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=tmp_path, env=env)
    out = proc.stdout + proc.stderr
    print(out[out.find("SUMMARY"):] if "SUMMARY" in out else out[-3000:])
    m = re.search(r"(\d+) generated", out)
    assert m, out[-3000:]
    assert int(m.group(1)) >= 4 * EXAMPLES, out[-3000:]     # the four operations with a body reach the cap
    assert proc.returncode == 0, out[-6000:]
    assert "5xx" not in out.split("SUMMARY")[-1] and "Server error" not in out
    assert "No issues found" in out, out[-6000:]
