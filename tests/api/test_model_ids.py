"""Serving by Hugging Face model id. `huggingface_hub` itself downloads from a local stand-in of
the Hub (tests/api/fake_hub.py; HF_ENDPOINT points there), so the cache is laid out by the library;
then `serve ORG/NAME` with HF_HUB_OFFLINE=1 serves from that cache with no Hub at all. Gated,
missing and non-diffusion repositories fail with one clear line before any weights move."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .conftest import start_server
from .fake_hub import FakeHub

REPO = "tiny-org/tiny-llada"
NOT_SERVED = ("README.md", "pytorch_model.bin", "modeling_llada.py")


@pytest.fixture(scope="module")
def hub(tiny_llada, tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    repo = root / "tiny-llada"
    shutil.copytree(tiny_llada, repo)
    (repo / "README.md").write_text("# a tiny random LLaDA\n")
    (repo / "pytorch_model.bin").write_bytes(b"\0" * 4096)          # a weight format the server never reads
    (repo / "modeling_llada.py").write_text("# remote code the server does not run\n")
    causal = root / "qwen"
    causal.mkdir()
    (causal / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}))
    hub = FakeHub()
    hub.add(REPO, repo)
    hub.add("tiny-org/gated-llada", repo, gated_token="hf_sesame")
    hub.add("tiny-org/qwen", causal)
    yield hub
    hub.close()


def _env(home, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    return {**env, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


def test_model_id_is_fetched_once_then_served_offline(hub, tmp_path):
    home = tmp_path / "hf-home"
    cmd = [sys.executable, "-m", "dllm_server.cli", "generate", REPO, "--prompt", "ROMEO.", "--max-tokens", "8",
           "--block-length", "8", "--threads-per-worker", "1"]
    proc = subprocess.run(cmd, env=_env(home, HF_ENDPOINT=hub.url), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["num_tokens"] >= 1
    assert "Fetching" in proc.stderr or "Download" in proc.stderr, proc.stderr[-2000:]     # the library's bar

    from huggingface_hub import scan_cache_dir           # the library's own view of its cache
    (cached,) = scan_cache_dir(home / "hub").repos
    files = {f.file_name for rev in cached.revisions for f in rev.files}
    assert cached.repo_id == REPO and {"config.json", "model.safetensors", "tokenizer.json"} <= files
    assert not files & set(NOT_SERVED)
    assert not any(r.endswith(NOT_SERVED) for r in hub.requests if r.startswith("GET"))

    seen = len(hub.requests)
    offline = _env(home, HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")   # nothing listens there
    s = start_server(REPO, "--block-length", "8", tmp_path=tmp_path, env=offline)
    try:
        assert httpx.get(s.url + "/v1/models", timeout=10).json()["data"][0]["id"] == REPO
        r = httpx.post(s.url + "/v1/completions", json={"model": REPO, "prompt": "ROMEO.", "max_tokens": 8},
                       timeout=60)
        assert r.status_code == 200 and r.json()["model"] == REPO, r.text
    finally:
        s.stop()
    assert len(hub.requests) == seen                       # the offline server never asked the Hub


RESOLVE = ("import sys; from dllm_server.checkpoint import model_path\n"
           "try: print(model_path(sys.argv[1], sys.argv[2] or None, sys.argv[3]))\n"
           "except ValueError as e: sys.exit(str(e))")


def _resolve(hub, cache, repo, revision="", **env) -> subprocess.CompletedProcess:
    """model_path in a fresh process: huggingface_hub reads HF_ENDPOINT / HF_TOKEN / HF_HUB_OFFLINE
    from the environment as a user's would (at import), so nothing of the library is patched."""
    home = cache.parent / "hf-home"
    return subprocess.run([sys.executable, "-c", RESOLVE, repo, revision, str(cache)], capture_output=True,
                          text=True, timeout=120, env=_env(home, HF_ENDPOINT=hub.url, HF_HUB_ETAG_TIMEOUT="5", **env))


@pytest.mark.parametrize("repo,match", [
    ("tiny-org/gated-llada", "gated repository"),
    ("tiny-org/nothing-here", "neither a local folder nor a repository"),
    ("tiny-org/qwen", "Qwen2ForCausalLM.*not a diffusion LLM"),
])
def test_bad_repositories_fail_clearly_before_any_weights(hub, tmp_path, repo, match):
    before = len(hub.requests)
    proc = _resolve(hub, tmp_path / "cache", repo)
    assert proc.returncode == 1 and re.search(match, proc.stderr.strip().splitlines()[-1]), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not any("safetensors" in r for r in hub.requests[before:])


def test_a_token_opens_a_gated_repository_and_a_missing_revision_is_named(hub, tmp_path):
    proc = _resolve(hub, tmp_path / "cache", "tiny-org/gated-llada", HF_TOKEN="hf_sesame")
    assert proc.returncode == 0, proc.stderr[-2000:]
    folder = Path(proc.stdout.strip().splitlines()[-1])
    assert (folder / "model.safetensors").is_file() and not (folder / "README.md").exists()
    proc = _resolve(hub, tmp_path / "cache", REPO, "v9")
    assert proc.returncode == 1 and "revision: 'v9' does not exist" in proc.stderr, proc.stderr[-2000:]


def test_offline_and_not_cached_says_so(hub, tmp_path):
    proc = _resolve(hub, tmp_path / "cache", REPO, HF_HUB_OFFLINE="1")
    assert proc.returncode == 1 and "not in the Hugging Face cache" in proc.stderr, proc.stderr[-2000:]


def test_a_local_folder_still_wins(tiny_llada, tmp_path, monkeypatch):
    from dllm_server.checkpoint import model_path, served_name
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    shutil.copytree(tiny_llada, tmp_path / "org" / "model")
    assert model_path("org/model").resolve() == (tmp_path / "org" / "model").resolve()
    assert served_name("org/model", model_path("org/model")) == "model"
    assert served_name(REPO, tmp_path) == REPO
