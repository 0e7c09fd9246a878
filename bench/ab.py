"""Before/after in one run: a benchmark script run alternately against two source trees (a git
ref, checked out into a temporary worktree, and the current checkout), so drift on a shared
machine hits both alike. Each side runs the script of its own tree when it has one (so a bench
that reads engine internals matches its code), else the current tree's copy; the package is
imported from that side's tree (PYTHONPATH), and so is the server a script starts.

    python bench/ab.py --ref a31dc80 --rounds 2 -- bench/front_cpu.py --streams 64
    python bench/ab.py --ref a31dc80 --script-from current --overlay src/dllm_server/server_process.py \
        -- bench/http_vs_offline.py --threads 1 --rounds 1

`--script-from current` runs the current tree's script on both sides (it must use only what both
trees have); `--overlay PATH` copies a file the older tree lacks (a helper module the script
imports, never code the benchmark measures) into its worktree.

Each side's stdout is printed under a header; a script that ends its output with a line
`RESULT {json}` also gets its numbers tabulated side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worktree(ref: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(into), ref], check=True)
    return into


def run_side(tree: Path, script: str, args: list[str], own_script: bool = True) -> tuple[str, dict | None]:
    own = tree / script
    path = own if own.is_file() and own_script else ROOT / script
    # The package under test comes from the side's tree; with the current script, so does nothing
    # else: the harness (bench helpers, the load generator) is the current tree's on both sides.
    harness = [str(tree)] if own_script else [str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), *harness, str(path.parent)])}
    proc = subprocess.run([sys.executable, str(path), *args], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed on {tree} (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    return proc.stdout, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="the 'before' git ref")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--script-from", choices=("own", "current"), default="own")
    ap.add_argument("--overlay", action="append", default=[], help="file to copy into the older tree if missing")
    ap.add_argument("script", help="bench script path relative to the tree root")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    ns = ap.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as tmp:
        before = worktree(ns.ref, Path(tmp) / "before")
        for rel in ns.overlay:
            if not (before / rel).exists():
                shutil.copy(ROOT / rel, before / rel)
        sides = [(f"before ({ns.ref})", before), (f"after ({head}{'+changes' if dirty else ''})", ROOT)]
        results: dict[str, list[dict]] = {name: [] for name, _ in sides}
        try:
            for r in range(ns.rounds):
                for name, tree in sides if r % 2 == 0 else sides[::-1]:
                    out, res = run_side(tree, ns.script, args, ns.script_from == "own")
                    print(f"===== {name}, round {r + 1}: python {ns.script} {' '.join(args)}")
                    print(out.rstrip(), flush=True)
                    if res is not None:
                        results[name].append(res)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False)
    if all(results.values()):
        keys = [k for k in results[sides[0][0]][0] if isinstance(results[sides[0][0]][0][k], (int, float))]
        print("\n| side | round | " + " | ".join(keys) + " |")
        print("|---|---|" + "---|" * len(keys))
        for name, rows in results.items():
            for i, row in enumerate(rows):
                print(f"| {name} | {i + 1} | " + " | ".join(_fmt(row.get(k)) for k in keys) + " |")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


if __name__ == "__main__":
    main()
