#!/usr/bin/env bash
# Download, here, the wheels the serving stack needs on the lent GPU machine (Python 3.12, torch
# preinstalled, no package registry there): they travel in .whl/ (git-ignored by .gitignore)
# and scripts/gpu_run.sh installs them there, ahead of the image's own. The versions are this
# repo's CI versions, the HTTP client stack included: starlette needs anyio >= 4, and the image's
# anyio, httpx and prometheus_client are of unknown versions. flashinfer-python is not among
# them: its wheel (about 100 MB) is over the 64 MiB a device call can carry, so the FlashInfer
# check is skipped there unless the image has it.
# GPU_WHEELS_PY=3.11 GPU_WHEELS_DIR=/tmp/w bash scripts/gpu_wheels.sh: the same set for a CPU rehearsal.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${GPU_WHEELS_DIR:-.whl}"
mkdir -p "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_WHEELS_PY:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  starlette==1.10.0 uvicorn==0.54.0 h11==0.16.0 click==8.5.1 typing_extensions==4.16.0 \
  anyio==4.16.0 idna==3.20 httpx==0.28.1 httpcore==1.0.9 certifi==2026.10.19.post1 \
  prometheus_client==0.26.0
du -sh "$dir"
