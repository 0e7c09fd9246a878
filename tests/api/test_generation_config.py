"""generation_config.json over HTTP, as vLLM honours it: a request that leaves a field out gets the
checkpoint's recommended value (temperature, top_k, max_new_tokens), a field the request gives
wins, and `--generation-config none` serves the server's own defaults. (The offline LLM and the
parsing are in tests/model/test_checkpoint_files.py.)"""
import json
import shutil

import httpx
import pytest

from .conftest import start_server

PROMPT = {"prompt": [5, 6, 7, 8], "ignore_eos": True, "return_token_ids": True, "seed": 9}


@pytest.fixture(scope="module")
def tuned(tiny_llada, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gen-http") / "m"
    shutil.copytree(tiny_llada, folder)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 1.0, "top_k": 3, "max_new_tokens": 12}))
    return folder


def _ids(url: str, **body) -> list[int]:
    r = httpx.post(url + "/v1/completions", json={**PROMPT, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def test_served_requests_take_the_generation_config_defaults(tuned, tmp_path):
    s = start_server(str(tuned), "--block-length", "8", tmp_path=tmp_path)
    try:
        default = _ids(s.url)
        assert len(default) == 12                                            # max_new_tokens
        assert default == _ids(s.url, temperature=1.0, top_k=3, max_tokens=12)   # the file's values, as given
        assert _ids(s.url, temperature=0.0) == _ids(s.url, temperature=0.0, top_k=0)    # the request wins
        assert _ids(s.url, temperature=0.0) != default
    finally:
        s.stop()
    plain = start_server(str(tuned), "--block-length", "8", "--generation-config", "none", tmp_path=tmp_path)
    try:
        assert len(_ids(plain.url)) == 16                                    # the server's completion default
        assert _ids(plain.url) == _ids(plain.url, temperature=0.0)           # greedy, the server's default
    finally:
        plain.stop()
