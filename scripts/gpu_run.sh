#!/usr/bin/env bash
# The one prepared command for a lent GPU machine (docs/gpu.md, "Running it"): install the carried
# wheels ahead of the image's packages, record the environment, then run bench.gpu with its
# results under $OUT. Arguments go to bench.gpu after the defaults here, so they win.
#   first run:  carry [".whl"], command "bash scripts/gpu_run.sh", timeout_s 480
#   fallback A: "bash scripts/gpu_run.sh --only capacity --time-budget-s 190", timeout_s 230
#   fallback B: "bash scripts/gpu_run.sh --only correctness,gemm,decode,prefill --time-budget-s 190", 230
#   (which one, and when: docs/gpu.md, "The first run on a lent H200")
# GPU_RUN_WHEELS / GPU_RUN_SITE move the wheel folder and the install target (a CPU rehearsal).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Every request of the run goes to 127.0.0.1: through a proxy named in the environment (httpx
# honours those variables) each would turn into a long timeout.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"
OUT="${OUT:-runs}"
WHEELS="${GPU_RUN_WHEELS:-.whl}"
SITE="${GPU_RUN_SITE:-/tmp/site}"
mkdir -p "$OUT"
info="$OUT/gpu_info.txt"
: > "$info"
py=$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
if ! compgen -G "$WHEELS/*.whl" > /dev/null; then
  echo "no wheels in $WHEELS (run scripts/gpu_wheels.sh here and carry .whl): the image's packages" | tee -a "$info"
elif compgen -G "$WHEELS/*-cp3*-*.whl" > /dev/null && ! compgen -G "$WHEELS/*-$py-*.whl" > /dev/null; then
  echo "wheels in $WHEELS are not built for $py: not installed, the installed packages are used" | tee -a "$info"
else
  # Always, not only when an import fails: the image's anyio / httpx / prometheus_client versions are unknown.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl 2>&1 | grep -v "already exists" | tee -a "$info"
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
  export PYTHONPATH="$SITE:$PYTHONPATH"   # first: the pinned versions win over the image's
  echo "installed $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE" | tee -a "$info"
fi
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1 | tee -a "$info"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tee -a "$info"
df -h "$(python3 -c 'import tempfile; print(tempfile.gettempdir())')" /dev/shm 2>&1 | tee -a "$info"
python3 -m bench.gpu_env 2>&1 | tee -a "$info"   # every imported package's version; warnings; never stops the run
python3 -m bench.gpu --out "$OUT/gpu_bench.json" --time-budget-s 400 "$@" 2>&1 | tee "$OUT/gpu_bench.log"
exit "${PIPESTATUS[0]}"
