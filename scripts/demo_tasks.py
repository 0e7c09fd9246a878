"""Write the demo tasks' evaluation set (dllm_server.demo_tasks), shipped with the package.

    python scripts/demo_tasks.py            # -> src/dllm_server/assets/eval/demo_tasks.jsonl

Copy lines come from the held-out split of the demo corpus (scripts/demo_data.py), so no copied
line was trained on; every question is also excluded from training by its hash
(demo_tasks.question_key, scripts/train_demo.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_data as D  # noqa: E402

from dllm_server import demo_tasks as T  # noqa: E402

SEED = 20261202      # the evaluation set's own seed (training draws from the data RNG of train_demo.py)
PER_TASK = 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(T.eval_path()))
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--per-task", type=int, default=PER_TASK)
    args = ap.parse_args()
    _, held = D.load_split()
    items = T.eval_set(args.seed, args.per_task, T.copy_lines(held))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(i.to_json()) + "\n" for i in items))
    print(f"wrote {len(items)} items to {out}: {dict(Counter(i.task for i in items))}")


if __name__ == "__main__":
    main()
