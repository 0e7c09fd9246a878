"""The images' ENTRYPOINT + CMD (and the compose services' commands) parse with the real CLI."""
from __future__ import annotations

import argparse
import contextlib
import io

import pytest
import yaml

from dllm_server.cli import build_parser, config_from_args
from dllm_server.config import ServerConfig

from .dockerctx import COMPOSE_FILE, DOCKERFILES, REPO, last, parse_dockerfile, stages


def exec_form(image: str) -> tuple[list[str], list[str]]:
    final = stages(parse_dockerfile(DOCKERFILES[image]))[-1]
    entrypoint, cmd = last(final, "ENTRYPOINT"), last(final, "CMD")
    assert entrypoint is not None and cmd is not None, f"{image}: ENTRYPOINT and CMD are both needed"
    # exec (JSON) form: the server is PID 1's child of tini / PID 1 itself and gets SIGTERM directly
    assert entrypoint.json and cmd.json, f"{image}: use the exec form for ENTRYPOINT and CMD"
    return list(entrypoint.value), list(cmd.value)


def parse_cli(argv: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(argv)
    except SystemExit as e:   # argparse reports and exits
        pytest.fail(f"dllm-server {' '.join(argv)} does not parse (exit {e.code}): {err.getvalue()}")


def check_serve(argv: list[str]) -> ServerConfig:
    ns = parse_cli(argv)
    assert ns.command == "serve"
    config = config_from_args(ns)   # ServerConfig validates every value
    assert config.host == "0.0.0.0", "inside a container the server must listen on all interfaces"
    assert config.port == 8000, "the images EXPOSE 8000 and the health check probes it"
    return config


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_entrypoint_and_cmd_parse(image, monkeypatch):
    monkeypatch.delenv("DLLM_API_KEY", raising=False)
    entrypoint, cmd = exec_form(image)
    assert entrypoint == ["dllm-server", "serve"]
    config = check_serve(entrypoint[1:] + cmd)
    assert config.model is None, f"{image}: the default CMD serves the embedded demo model"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_documented_overrides_parse(image, monkeypatch):
    # `docker run IMAGE ARGS...` replaces CMD; these are the forms docs/deploy.md shows
    monkeypatch.setenv("DLLM_API_KEY", "secret")
    entrypoint, _ = exec_form(image)
    for args in (["/models", "--host", "0.0.0.0"],
                 ["/models", "--host", "0.0.0.0", "--dtype", "bfloat16", "--num-workers", "2"],
                 ["/models", "--host", "0.0.0.0", "--placement", "disaggregated", "--num-workers", "2",
                  "--num-prefill-workers", "1"],
                 ["/models", "--host", "0.0.0.0", "--placement", "hybrid", "--overflow-threshold-tokens", "4096",
                  "--token-budget", "2048", "--block-length", "32", "--threshold", "0.9", "--cache", "dual"]):
        config = check_serve(entrypoint[1:] + args)
        assert config.model == "/models"
        assert config.api_key == "secret", "DLLM_API_KEY from the env file must reach the config"


def compose_services() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


@pytest.mark.parametrize("service", ["dllm-gpu", "dllm-cpu"])
def test_compose_commands_parse(service, monkeypatch):
    monkeypatch.delenv("DLLM_API_KEY", raising=False)
    spec = compose_services()[service]
    dockerfile = (COMPOSE_FILE.parent / spec["build"]["context"] / spec["build"]["dockerfile"]).resolve()
    image = next(k for k, v in DOCKERFILES.items() if v.resolve() == dockerfile)
    entrypoint = spec.get("entrypoint") or exec_form(image)[0]
    command = spec.get("command") or exec_form(image)[1]
    assert isinstance(command, list), "use the list form so no shell re-splits arguments"
    config = check_serve(list(entrypoint)[1:] + list(command))
    if service == "dllm-gpu":
        assert config.model == "/models"
        mounts = [v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in spec["volumes"]]
        assert any(m.rsplit(":", 2)[1:] == ["/models", "ro"] for m in mounts), \
            "the model folder is mounted read-only at /models"
    else:
        assert config.model is None


def test_readme_entrypoint_names_the_console_script():
    # `dllm-server` must stay the console script the ENTRYPOINT calls
    assert 'dllm-server = "dllm_server.cli:main"' in (REPO / "pyproject.toml").read_text()


def documented_docker_runs() -> list[list[str]]:
    """Arguments after the image name of every `docker run ... dllm-server:TAG ...` in docs/deploy.md."""
    import re
    import shlex

    text = (REPO / "docs" / "deploy.md").read_text()
    runs = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0]
            if "docker run" not in line or "--entrypoint" in line:
                continue
            words = shlex.split(line)
            image_at = [i for i, w in enumerate(words) if re.fullmatch(r"dllm-server:[\w.-]+", w)]
            if image_at:
                runs.append(words[image_at[0] + 1:])
    return runs


def test_docs_docker_run_examples_parse(monkeypatch):
    monkeypatch.delenv("DLLM_API_KEY", raising=False)
    runs = documented_docker_runs()
    assert len(runs) >= 3, runs
    for args in runs:
        if args == ["--help"]:
            continue
        if args:   # replacing CMD: the host must be repeated
            check_serve(["serve"] + args)
        else:
            check_serve(["serve"] + exec_form("cpu")[1])
