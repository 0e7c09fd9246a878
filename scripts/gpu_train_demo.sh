#!/usr/bin/env bash
# Demo model v3 (issue 26) on a lent GPU, as one prepared command: fine-tune v2 on the demo tasks
# mixed with its Shakespeare text and chat rows for a time budget, then score the snapshots and
# bring back the final weights and the two best others, sharded (scripts/gpu_pick_snapshots.py).
# The corpus must travel with the tree (no network there): once, here,
#   mkdir -p .gpu && cp -r ~/.cache/dllm-server/corpus .gpu/ && echo /.gpu/ >> .git/info/exclude
# then: run(command="bash scripts/gpu_train_demo.sh", carry=[".gpu"], timeout_s=570).
# BUDGET_MIN (training minutes), DEVICE and OUT may be set (a CPU rehearsal: DEVICE=cpu BUDGET_MIN=1).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
OUT="${OUT:-runs/gpu_out}"
RUN="${RUN:-/tmp/demo3}"
DEVICE="${DEVICE:-cuda}"
T0=$(date +%s)
mkdir -p "$OUT" "$RUN"
LOG="$OUT/run.log"      # one log, history.json and six shards: the tool brings back 8 files at most
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "cpus $(nproc)"; } 2>&1 | tee "$LOG"
python3 scripts/train_demo.py --out "$RUN" --device "$DEVICE" --data-workers "${WORKERS:-10}" \
    --time-budget-min "${BUDGET_MIN:-6.0}" --steps 100000 --eval-every "${EVAL_EVERY:-500}" \
    --snapshot-every "${EVAL_EVERY:-500}" --save-minutes 1000 --batch "${BATCH:-48}" --chat-share 0.5 \
    --task-rows "${TASK_ROWS:-160}" --task-len 96 --lr "${LR:-1e-3}" --warmup "${WARMUP:-200}" \
    --task-weights "${TASK_WEIGHTS:-}" --init-weights "${INIT:-src/dllm_server/assets/demo-model/model.safetensors}" --start-step 0 \
    --corpus-cache .gpu/corpus 2>&1 | tee -a "$LOG"
cp "$RUN/history.json" "$OUT/history.json" 2>/dev/null
# scoring starts no new snapshot after T0 + PICK_END_S (the run's timeout_s is 570)
python3 scripts/gpu_pick_snapshots.py pick "$RUN" "$OUT" --deadline-s $(( T0 + ${PICK_END_S:-515} - $(date +%s) )) 2>&1 | tee -a "$LOG"
ls -la "$OUT" | tee -a "$LOG"
