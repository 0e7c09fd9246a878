"""Build docker/Dockerfile.cpu from the checkout with podman (no Docker daemon) and run the image.

The image must build, serve the embedded demo model with no arguments and a mounted model folder
by argument, answer a chat and a streamed completion, carry a HEALTHCHECK that passes, run as a
non-root uid and stop on SIGTERM with exit 0 within the drain timeout. The stand-in base image,
the local torch index and podman's build cache are kept between runs (tests/docker/podmanctx.py):
on 2 cores a warm run costs about 30 s (2 min when src/ changed), a cold one about 5 min.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import httpx
import pytest

from dllm_server.config import ServerConfig
from dllm_server.server_process import wait_healthy

from . import podmanctx
from .dockerctx import DOCKERFILES, last, parse_dockerfile, stages

_why_not = podmanctx.unavailable()
pytestmark = [pytest.mark.timeout(2400), *([pytest.mark.skip(reason=_why_not)] if _why_not else [])]

API_KEY = "image-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
DRAIN_S = ServerConfig.__dataclass_fields__["shutdown_timeout_s"].default   # --shutdown-timeout-s default
STOP_GRACE_S = 45   # what docs/deploy.md tells `docker stop -t` (SIGKILL after it: exit 137)
START_TIMEOUT_S = 180
FINAL = stages(parse_dockerfile(DOCKERFILES["cpu"]))[-1]


def mb(n: float) -> str:
    return f"{n / 1e6:.0f} MB"


@pytest.fixture(scope="module")
def podman() -> podmanctx.Podman:
    return podmanctx.Podman()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("podman-image")


@pytest.fixture(scope="module")
def built(podman, logs) -> dict:
    """Builds the image once: {"id": ...} (an ID, not the tag, which a concurrent run may move) or {"error": ...}."""
    notes: list[str] = []
    try:
        with podmanctx.cache_lock():
            base, base_s = podmanctx.ensure_stand_in_base(podman, notes.append)
            index, index_s = podmanctx.ensure_torch_index(notes.append)
            build_s = podmanctx.build_image(podman, base, index, logs / "build.log")
            podmanctx.keep_build_cache(podman, base, index)
            info = podman.inspect("image", podmanctx.TEST_IMAGE)
    except RuntimeError as e:
        return {"error": str(e)}
    finally:
        if notes:
            print("\n".join(notes))
    top = podmanctx.layer_sizes(podman, info["Id"])[:2]
    podmanctx.METRICS.update({
        "build": f"{build_s:.0f} s" + (f" (+ stand-in base {base_s:.0f} s, torch index {index_s:.0f} s)"
                                        if base_s or index_s else " (base and index cached)"),
        "size": mb(info["Size"]) + " (" + ", ".join(f"{what} {mb(size)}" for size, what in top) + ")",
    })
    return {"id": info["Id"]}


@pytest.fixture(scope="module")
def image(built) -> str:
    if "error" in built:   # told once, in full, by test_image_builds
        pytest.fail("the image did not build (see test_image_builds)", pytrace=False)
    return built["id"]


@pytest.fixture(scope="module")
def server(image, podman, logs):
    """The image run with no arguments (its CMD): the embedded demo model on 0.0.0.0:8000."""
    name = f"dllm-image-test-{os.getpid()}"
    start = time.monotonic()
    srv = podmanctx.run_server(podman, image, name, log_path=logs / "default.log", env={"DLLM_API_KEY": API_KEY})
    try:
        wait_healthy(srv, START_TIMEOUT_S)
        podmanctx.METRICS["/health 200 after"] = f"{time.monotonic() - start:.1f} s"
        yield name, srv
    finally:
        podmanctx.remove_container(podman, srv, name)


@pytest.fixture
def client():
    with httpx.Client(trust_env=False, timeout=120) as c:
        yield c


def test_image_builds(built):
    if "error" in built:
        pytest.fail(built["error"], pytrace=False)


def seconds(duration: str) -> float:
    return float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


def test_image_config(image, podman):
    info = podman.inspect("image", image)
    config = info["Config"]
    # kept only with --format docker (the OCI format has no HEALTHCHECK); podman reports it beside Config
    hc, want = info.get("Healthcheck") or config.get("Healthcheck") or {}, last(FINAL, "HEALTHCHECK")
    assert hc.get("Test") == list(want.value), hc
    flags = dict(f[2:].split("=", 1) for f in want.flags)
    assert hc["StartPeriod"] == seconds(flags["start-period"]) * 1e9 and hc["Retries"] == int(flags["retries"])
    assert hc["Interval"] == seconds(flags["interval"]) * 1e9 and hc["Timeout"] == seconds(flags["timeout"]) * 1e9
    assert config["User"] == "10001:10001"
    assert config["StopSignal"] in ("SIGTERM", "15")
    assert config["Entrypoint"] == list(last(FINAL, "ENTRYPOINT").value)
    assert config["Cmd"] == list(last(FINAL, "CMD").value)
    assert "8000/tcp" in config["ExposedPorts"] and "/cache/huggingface" in config["Volumes"]


def test_health_and_embedded_model(server, client):
    _, srv = server
    assert client.get(srv.url + "/health").status_code == 200
    assert client.get(srv.url + "/v1/models").status_code == 401, "DLLM_API_KEY is required"
    models = client.get(srv.url + "/v1/models", headers=AUTH).json()["data"]
    assert len(models) == 1
    # the demo model shipped inside the package, not the random fallback written to ~/.cache
    assert models[0]["root"].startswith("/opt/venv/") and models[0]["root"].endswith("dllm_server/assets/demo-model")


def test_chat_completion(server, client):
    _, srv = server
    r = client.post(srv.url + "/v1/chat/completions", headers=AUTH, json={
        "model": "demo-model", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"].strip() and body["usage"]["completion_tokens"] > 0


def test_streamed_completion(server, client):
    _, srv = server
    chunks, done = [], False
    with client.stream("POST", srv.url + "/v1/completions", headers=AUTH, json={
            "model": "demo-model", "prompt": "Once upon a time", "max_tokens": 16, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    assert done and len(chunks) > 1
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]).strip()
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] in ("stop", "length")


def test_image_healthcheck_passes(server, podman):
    name, _ = server
    proc = podman("healthcheck", "run", name, check=False, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = podman.inspect("container", name)["State"]
    assert (state.get("Health") or state.get("Healthcheck") or {}).get("Status") == "healthy", state
    # the script itself, as HEALTHCHECK runs it: the port from the server's command line
    out = podman("exec", name, *last(FINAL, "HEALTHCHECK").value[1:], timeout=60).stdout
    assert out.strip() == "http://127.0.0.1:8000/health -> 200"


def test_runs_as_non_root(server, podman):
    name, _ = server
    rows = podman("top", name, "huser", "args").stdout.splitlines()[1:]
    assert len(rows) >= 2, rows   # the server and its worker(s)
    assert all(r.split()[0] == "10001" for r in rows), rows
    assert "Uid:\t10001\t10001\t10001\t10001" in podman("exec", name, "cat", "/proc/1/status").stdout


def test_mounted_model_served_by_argument(image, podman, logs, tiny_llada, client):
    # a copy readable by uid 10001 (pytest's temporary folders are 0700)
    model = logs / "mounted-model"
    shutil.copytree(tiny_llada, model)
    for p in (model, *model.rglob("*")):
        p.chmod(0o755 if p.is_dir() else 0o644)
    name = f"dllm-image-test-{os.getpid()}-mounted"
    srv = podmanctx.run_server(podman, image, name, "/models", "--host", "0.0.0.0", "--served-model-name", "mounted",
                               log_path=logs / "mounted.log", volumes=(f"{model}:/models:ro",))
    try:
        wait_healthy(srv, START_TIMEOUT_S)
        models = client.get(srv.url + "/v1/models").json()["data"]
        assert [(m["id"], m["root"]) for m in models] == [("mounted", "/models")]
        r = client.post(srv.url + "/v1/completions", json={"model": "mounted", "prompt": "Hi", "max_tokens": 8})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] > 0
    finally:
        podmanctx.remove_container(podman, srv, name)


def test_sigterm_stop(server, podman):
    # last in this module: it stops the shared container
    name, srv = server
    code, seconds = podmanctx.stop_container(podman, srv, name, STOP_GRACE_S)
    podmanctx.METRICS["stop (SIGTERM)"] = f"{seconds:.1f} s, exit {code}"
    assert code == 0, f"exit {code} after podman stop:\n{srv.log()[-3000:]}"
    assert seconds < DRAIN_S, f"stop took {seconds:.1f} s, more than the {DRAIN_S:.0f} s drain timeout"
    assert "all workers stopped" in srv.log()
