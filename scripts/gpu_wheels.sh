#!/usr/bin/env bash
# Download, here, the wheels the serving stack needs on the lent GPU machine (Python 3.12, torch
# preinstalled, no package registry there): they travel in .whl/ (git-ignored via
# .git/info/exclude) and scripts/gpu_run.sh installs them there. The versions are this repo's
# CI versions. flashinfer-python is not among them: its wheel (about 100 MB) is over the
# 64 MiB a device call can carry, so the FlashInfer check is skipped there unless the image has it.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  starlette==1.10.0 uvicorn==0.54.0 h11==0.16.0 click==8.5.1 typing_extensions==4.16.0
du -sh .whl
