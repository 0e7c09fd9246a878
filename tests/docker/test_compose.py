"""docker/compose.yaml: valid YAML with a GPU and a CPU service wired the way docs/deploy.md says."""
from __future__ import annotations

import re

import pytest
import yaml

from dllm_server.config import ServerConfig

from .dockerctx import COMPOSE_FILE, DOCKER_DIR, DOCKERFILES, copy_destinations, parse_dockerfile

SERVICES = ("dllm-gpu", "dllm-cpu")


@pytest.fixture(scope="module")
def compose() -> dict:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def seconds(duration: str) -> float:
    """Compose durations: 1m30s, 45s, 600s, 1h."""
    total, units = 0.0, {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration))
    assert parts and "".join(a + b for a, b in parts) == str(duration), f"bad duration {duration!r}"
    for amount, unit in parts:
        total += float(amount) * units[unit]
    return total


def test_expected_services(compose):
    assert set(SERVICES) <= set(compose["services"])


@pytest.mark.parametrize("service", SERVICES)
def test_service_basics(compose, service):
    spec = compose["services"][service]
    assert spec["restart"] == "unless-stopped"
    build = spec["build"]
    assert (COMPOSE_FILE.parent / build["context"] / build["dockerfile"]).is_file()
    assert (COMPOSE_FILE.parent / build["context"] / ".dockerignore").is_file()
    env_files = spec["env_file"] if isinstance(spec["env_file"], list) else [spec["env_file"]]
    names = [e if isinstance(e, str) else e["path"] for e in env_files]
    assert ".env" in names, "the API key comes from an env file"
    assert any(str(p).endswith(":8000") for p in spec["ports"])
    # the server drains for shutdown_timeout_s after SIGTERM; Docker must wait longer before SIGKILL
    assert seconds(spec["stop_grace_period"]) > ServerConfig().shutdown_timeout_s
    assert spec.get("init") is True, "an init process reaps the worker processes"
    assert any(str(v).split(":")[-1] == "/cache/huggingface" for v in spec["volumes"])


@pytest.mark.parametrize("service", SERVICES)
def test_healthcheck(compose, service):
    hc = compose["services"][service]["healthcheck"]
    assert hc["test"][0] in ("CMD", "CMD-SHELL")
    assert "/health" in " ".join(hc["test"]) or "/opt/dllm/healthcheck.py" in hc["test"]
    if "/opt/dllm/healthcheck.py" in hc["test"]:
        for dockerfile in DOCKERFILES.values():
            assert "/opt/dllm/healthcheck.py" in copy_destinations(parse_dockerfile(dockerfile))
    assert seconds(hc["timeout"]) < seconds(hc["interval"])
    assert seconds(hc["start_period"]) >= 60, "model loading takes a while; /health is 503 until then"
    assert int(hc["retries"]) >= 1


@pytest.mark.parametrize("service", SERVICES)
def test_shared_memory(compose, service):
    # torch.multiprocessing passes tensors through /dev/shm; Docker's default 64 MB is too small
    spec = compose["services"][service]
    if spec.get("ipc") != "host":
        size = str(spec.get("shm_size", ""))
        m = re.fullmatch(r"(\d+)\s*([kmg]?)b?", size.lower())
        assert m, f"{service}: set ipc: host or shm_size"
        factor = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2)]
        assert int(m.group(1)) * factor >= 1 * 2**30, f"{service}: shm_size {size} is too small"


def test_gpu_reservation(compose):
    devices = compose["services"]["dllm-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and d.get("count") == "all" and "gpu" in d.get("capabilities", [])
               for d in devices), "all NVIDIA GPUs reserved"
    assert "deploy" not in compose["services"]["dllm-cpu"]


def test_named_volume_declared(compose):
    used = {str(v).split(":")[0] for s in compose["services"].values() for v in s.get("volumes", [])}
    for name in used:
        if not name.startswith(("/", ".", "$", "~")):
            assert name in (compose.get("volumes") or {}), f"named volume {name} is not declared"


def test_env_example_and_gitignore():
    example = (DOCKER_DIR / ".env.example").read_text()
    assert re.search(r"^DLLM_API_KEY=", example, re.M)
    assert re.search(r"^MODEL_DIR=", example, re.M)
    assert ".env" in (DOCKER_DIR / ".gitignore").read_text().split()


def test_ray_compose_has_a_head_that_serves_and_a_worker_that_joins_it():
    """docker/compose.ray.yaml (docs/multinode.md): the CPU image with the ray extra; the head runs
    Ray's head and the server as its driver, spreading the workers; the worker node joins it. The
    server's flags parse into a valid ServerConfig."""
    from dllm_server.cli import build_parser, config_from_args
    data = yaml.safe_load((DOCKER_DIR / "compose.ray.yaml").read_text())
    head, worker = data["services"]["ray-head"], data["services"]["ray-worker"]
    for s in (head, worker):
        assert s["build"]["args"]["DLLM_EXTRAS"] == "serve,ray" and s["build"]["dockerfile"] == "docker/Dockerfile.cpu"
        assert str(s["shm_size"]).endswith("gb")      # Ray's object store lives in /dev/shm
    script = head["command"][0]
    assert script.startswith("ray start --head --port 6379")
    serve = script.split("exec dllm-server ", 1)[1].split()
    config = config_from_args(build_parser().parse_args(serve))
    assert config.distributed_executor_backend == "ray" and config.ray_address == "auto"
    assert config.ray_placement_strategy == "STRICT_SPREAD" and config.num_workers == 2
    assert "--address ray-head:6379" in worker["command"][0]
    assert any(p.endswith(":8000") for p in head["ports"])
