#!/usr/bin/env bash
# The one prepared command for a lent GPU machine (see docs/gpu.md): install the carried serve
# wheels if the image lacks them, then run bench/gpu.py with its results under $OUT.
#   device run: carry [".whl"], command "bash scripts/gpu_run.sh", timeout_s 560
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-runs}"
mkdir -p "$OUT"
if ! python3 -c "import pydantic, starlette, uvicorn" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH="/tmp/site:$PYTHONPATH"   # first: newer typing_extensions than the image may have
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/gpu_info.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tee -a "$OUT/gpu_info.txt"
python3 bench/gpu.py --out "$OUT/gpu_bench.json" "$@" 2>&1 | tee "$OUT/gpu_bench.log"
exit "${PIPESTATUS[0]}"
