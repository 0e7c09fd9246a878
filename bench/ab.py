"""Before/after in one run: a benchmark run alternately against a git ref (checked out into a
temporary worktree) and the current checkout, so drift on a shared machine hits both alike.

    python -m bench.ab --ref a31dc80 --rounds 2 -- bench.front_cpu --streams 64
    python -m bench.ab --ref c495d1e --rounds 2 --script-from current -- bench.hot_path --model "$PWD/training/demo-v1"
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import Table, parser

ROOT = Path(__file__).resolve().parents[1]
# -P keeps the working directory (the side's worktree) off the path, so that the bench package
# and loadgen come from PYTHONPATH; Python 3.10 has no -P and takes the side's loadgen instead.
SAFE_PATH = ["-P"] if sys.version_info >= (3, 11) else []


def module_name(script: str) -> str:
    """bench.x, given bench.x, bench/x.py or bench/x."""
    return script.removesuffix(".py").replace("/", ".")


def worktree(ref: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(into), ref], check=True)
    return into


def command(tree: Path, module: str, own_script: bool) -> tuple[list[str], list[Path]]:
    """(command line, PYTHONPATH) that run `module` on the side whose worktree is `tree`: by default
    its own script on its own package, `python -m bench.x` where bench/ is a package, the file
    bench/x.py (its folder on the path) in an older tree whose bench/ was a folder of scripts."""
    file = tree / Path(*module.split(".")).with_suffix(".py")
    if own_script and file.is_file() and (tree / "bench" / "__init__.py").is_file():
        return [sys.executable, *SAFE_PATH, "-m", module], [tree / "src", tree]
    if own_script and file.is_file():      # the layout before bench/ was a package: its scripts import each other
        return [sys.executable, str(file)], [tree / "src", tree, file.parent]
    # this tree's script (and its harness, and the load generator) on the side's package
    return [sys.executable, *SAFE_PATH, "-m", module], [tree / "src", ROOT]


def run_side(tree: Path, module: str, args: list[str], own_script: bool = True) -> tuple[str, dict | None]:
    """The script's output, and the figures of its last `RESULT {json}` line (tabulated side by side)."""
    cmd, path = command(tree, module, own_script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    proc = subprocess.run([*cmd, *args], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{module} failed on {tree} (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    return proc.stdout, result


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--ref", required=True, help="the 'before' git ref")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--script-from", choices=("own", "current"), default="own",
                    help="current: this tree's script on both sides, only the package (src/) from each side's "
                         "tree (the script must use only what both trees have)")
    ap.add_argument("--overlay", action="append", default=[],
                    help="a file to copy into the older tree if missing: a helper module the script imports "
                         "(never code the benchmark measures), e.g. src/dllm_server/server_process.py")
    ap.add_argument("script", help="the benchmark module, bench.x (or its path, bench/x.py)")
    ap.add_argument("args", nargs="...")
    ns = ap.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    module = module_name(ns.script)
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
                    out, res = run_side(tree, module, args, ns.script_from == "own")
                    print(f"===== {name}, round {r + 1}: python -m {module} {' '.join(args)}")
                    print(out.rstrip(), flush=True)
                    if res is not None:
                        results[name].append(res)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False)
    if all(results.values()):
        first = results[sides[0][0]][0]
        keys = [k for k in first if isinstance(first[k], (int, float))]
        print()
        table = Table(["side", "round", *keys], cell=lambda v: f"{v:.4g}")
        for name, rows in results.items():
            for i, row in enumerate(rows):
                table.row(name, i + 1, *(row.get(k) for k in keys))


if __name__ == "__main__":
    main()
