"""Static checks of the package's module structure (run by tests/unit/test_structure.py):

- no import cycle of any length among the package's modules, counting every import: module
  level, `TYPE_CHECKING` ones and those inside functions or methods (a lazy import only hides a
  circle from Python, not from the design);
- the front process's layers (engine/, api/) import nothing from worker/ or model/ except
  through the seam, engine/worker_pool.py and engine/launchers.py (they start the worker
  processes: the entries they run);
- api/ reads the engine only through AsyncEngine's public surface: no `.scheduler` attribute;
- no module over MAX_LINES lines, and the Scheduler class under MAX_SCHEDULER lines.

    python scripts/check_imports.py        # prints the findings, exit 1 if any
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "dllm_server"
SEAMS = {"dllm_server.engine.worker_pool", "dllm_server.engine.launchers"}
FRONT = ("dllm_server.engine", "dllm_server.api")
BACK = ("dllm_server.worker", "dllm_server.model")
MAX_LINES, MAX_SCHEDULER = 400, 250


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(mod: str, is_pkg: bool, level: int, target: str | None) -> str:
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports(path: Path, modules: set[str]) -> set[str]:
    """Package modules `path` imports anywhere in it (module level, under `if`/`try`, inside
    functions, methods and classes)."""
    mod, is_pkg = module_name(path), path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("dllm_server"))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, is_pkg, node.level, node.module) if node.level else (node.module or "")
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in out if m in modules and m != mod}


def graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, anywhere in it."""
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports(f, modules) for f in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                dfs(n)
        stack.pop()
        state[m] = 2
    for m in sorted(g):
        if m not in state:
            dfs(m)
    return found


def seam_violations(g: dict[str, set[str]]) -> list[str]:
    return [f"{m} imports {n}" for m, deps in sorted(g.items()) if m.startswith(FRONT) and m not in SEAMS
            for n in sorted(deps) if n.startswith(BACK)]


def engine_surface_violations() -> list[str]:
    """api/ modules that reach into the engine's scheduler (attribute `.scheduler`)."""
    out = []
    for f in sorted((PKG / "api").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "scheduler":
                out.append(f"{f.relative_to(PKG.parent)}:{node.lineno} reads .scheduler")
    return out


def size_violations() -> list[str]:
    out = [f"{f.relative_to(PKG.parent)}: {n} lines" for f in sorted(PKG.rglob("*.py"))
           if (n := len(f.read_text().splitlines())) > MAX_LINES]
    tree = ast.parse((PKG / "engine" / "scheduler.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Scheduler":
            n = node.end_lineno - node.lineno + 1
            if n >= MAX_SCHEDULER:
                out.append(f"Scheduler: {n} lines")
    return out


def main() -> int:
    g = graph()
    problems = ([" -> ".join(c) for c in cycles(g)] + seam_violations(g)
                + engine_surface_violations() + size_violations())
    print(f"{len(g)} modules, {sum(map(len, g.values()))} import edges: "
          f"{'OK' if not problems else str(len(problems)) + ' problem(s)'}")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
