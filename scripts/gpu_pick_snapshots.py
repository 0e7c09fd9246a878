"""After a demo-model run on a lent GPU (scripts/gpu_train_demo.sh): score every snapshot, copy the
final weights and the two best other snapshots out, each as two safetensors shards (the device
tool brings back files of at most 16 MiB; a bf16 demo model is 20 MB). `merge` rejoins them here.

    python scripts/gpu_pick_snapshots.py pick RUN OUT [--deadline-s 90]   # scoring stops starting after it
    python scripts/gpu_pick_snapshots.py merge OUT/step5000 runs/demo3/step5000.safetensors

Score: the demo tasks decoded greedily through the offline LLM (the server's own decoding) on the
first 10 evaluation items per task at thresholds 0.9 and 0.3; snapshots whose held-out CE
(history.json) is above v2's 1.667 rank last. Without time for decoding, the first-forward probe's
argmax share ranks them. The choice here is only what comes back: the shipped checkpoint is chosen
afterwards by scripts/eval_demo.py on the whole evaluation set.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

CE_GATE = 1.667


def shard(src: Path, out_prefix: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(str(src), "pt") as f:
        keys, meta = sorted(f.keys()), f.metadata()
        tensors = {k: f.get_tensor(k) for k in keys}
    half = sum(t.numel() for t in tensors.values()) // 2
    parts, run = ({}, {}), 0
    for k in keys:
        parts[run >= half][k] = tensors[k]
        run += tensors[k].numel()
    for i, part in enumerate(parts):
        save_file(part, f"{out_prefix}.part{i}.safetensors", metadata=meta)


def merge(prefix: str, dest: str) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file
    tensors, meta = {}, None
    for i in (0, 1):
        with safe_open(f"{prefix}.part{i}.safetensors", "pt") as f:
            meta = f.metadata()
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    save_file(tensors, dest, metadata=meta)


def decode_scores(folder: Path, snap: Path) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_demo import evaluate_tasks
    from dllm_server.demo_tasks import load_eval
    ck = folder / "ck"
    ck.mkdir(exist_ok=True)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / "model" / name, ck / name)
    shutil.copy(snap, ck / "model.safetensors")
    r = evaluate_tasks(str(ck), load_eval(per_task=10), (0.9, 0.3), enforce_eager=True)
    t = r["thresholds"]
    return {"macro_09": t["0.9"]["macro_exact_match"], "copied_09": t["0.9"]["copied"]["exact_match"],
            "computed_09": t["0.9"]["computed"]["exact_match"], "computed_03": t["0.3"]["computed"]["exact_match"],
            "answer_tokens_per_forward_09": t["0.9"]["all"]["answer_tokens_per_forward"],
            "per_task_09": {k: v["exact_match"] for k, v in t["0.9"].items() if isinstance(v, dict) and "exact_match" in v}}


def pick(run: str, out: str, deadline_s: float) -> None:
    run_dir, out_dir = Path(run), Path(out)
    t_end = time.monotonic() + deadline_s
    history = {h["step"]: h for h in json.loads((run_dir / "history.json").read_text()) if "held_out_ce" in h}
    snaps = {int(p.stem.removeprefix("step")): p for p in (run_dir / "snapshots").glob("step*.safetensors")}
    final = max(history)
    snaps[final] = run_dir / "model" / "model.safetensors"
    shard(snaps[final], out_dir / f"step{final}")       # first: whatever happens next, these come back
    rows = {}
    for step in sorted(snaps, reverse=True):          # newest first: the likeliest to be chosen
        h = history.get(step, {})
        row = {"step": step, "held_out_ce": h.get("held_out_ce"),
               "probe_argmax": sum(f["argmax_right"] for f in h.get("tasks", {}).values()) / 7}
        if time.monotonic() < t_end:
            try:
                row.update(decode_scores(run_dir, snaps[step]))
            except Exception as e:          # the weights matter more than the score: never lose them
                row["decode_error"] = repr(e)[:300]
        rows[step] = row
        print(json.dumps(row), flush=True)

    def score(r):
        ce_ok = r["held_out_ce"] is not None and r["held_out_ce"] <= CE_GATE
        q = (min(r["copied_09"], 0.9) + min(r["computed_09"], 0.6) + min(r["computed_09"] - r["computed_03"], 0.1)
             if "macro_09" in r else r["probe_argmax"])
        return (ce_ok, "macro_09" in r, q)
    ranked = sorted((s for s in rows if s != final), key=lambda s: score(rows[s]), reverse=True)
    chosen = [final] + ranked[:2]
    for step in chosen[1:]:
        shard(snaps[step], out_dir / f"step{step}")
    print("chosen:", chosen, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "merge":
        merge(sys.argv[2], sys.argv[3])
    else:
        deadline = float(sys.argv[sys.argv.index("--deadline-s") + 1]) if "--deadline-s" in sys.argv else 90.0
        deadline = max(0.0, deadline)
        pick(sys.argv[2], sys.argv[3], deadline)
