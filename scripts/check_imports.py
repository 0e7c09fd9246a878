"""Static checks of the package's structure (run by tests/test_structure.py):

- layer rules: a package (a folder of dllm_server, or a top-level module) imports only the
  packages LAYERS allows it, counting every import: module level, `TYPE_CHECKING` ones and those
  inside functions (a lazy import hides a dependency from Python, not from the design);
- no import cycle of any length among the package's modules;
- api/ reads the engine only through AsyncEngine's public surface: no `.scheduler` attribute;
- no module over MAX_LINES lines.

    python scripts/check_imports.py           # the findings, exit 1 if any
    python scripts/check_imports.py --graph   # also the allowed graph and the one in use
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "dllm_server"
MAX_LINES = 400

_BASE = {"config", "decoding", "messages"}
# What each package may import, lowest first. The front process (api, engine, scheduler, request,
# policy, cluster, costmodel) never reaches worker/ or model/ (torch, the model): only the executor,
# which starts worker processes, names their entry point.
LAYERS: dict[str, set[str]] = {
    "config": set(),
    "decoding": set(),
    "hub": set(),
    "devices": set(),
    "demo_tasks": set(),
    "server_process": set(),
    "checkpoint": {"hub", "decoding"},
    "messages": {"config", "decoding"},
    "model": {"checkpoint"},
    "costmodel": {"messages"},
    "structured": {"decoding", "checkpoint"},
    "worker": _BASE | {"model", "costmodel", "structured"},
    "executor": _BASE | {"worker", "server_process"},
    "request": {"messages", "decoding"},
    "policy": _BASE | {"request", "costmodel"},
    "scheduler": _BASE | {"policy", "request", "costmodel"},
    "cluster": _BASE | {"scheduler", "costmodel"},
    "engine": _BASE | {"scheduler", "executor", "cluster", "policy", "request", "costmodel", "checkpoint", "devices",
                       "structured"},
    "llm": _BASE | {"scheduler", "worker", "policy", "request", "costmodel", "checkpoint", "devices", "structured"},
    "sim": _BASE | {"scheduler", "worker", "cluster", "policy", "request", "costmodel", "checkpoint", "engine",
                    "server_process"},
    "sizing": _BASE | {"sim", "costmodel", "checkpoint"},
    "api": _BASE | {"engine", "request", "checkpoint", "server_process", "dllm_server"},
    "assets": {"demo_tasks"},
    "dllm_server": {"llm", "decoding"},       # the package's own __init__: its public names
    "cli": set(),                             # the command line may use anything (checked below)
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """The layer a module belongs to: its folder under dllm_server, or the module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


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


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """package -> the packages its modules import."""
    out: dict[str, set[str]] = {}
    for m, deps in g.items():
        out.setdefault(package_of(m), set()).update(package_of(d) for d in deps if package_of(d) != package_of(m))
    return out


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


def layer_violations(g: dict[str, set[str]]) -> list[str]:
    out = []
    for m, deps in sorted(g.items()):
        pkg = package_of(m)
        if pkg not in LAYERS:
            out.append(f"{m}: package {pkg!r} has no layer rule (add it to LAYERS)")
            continue
        if pkg == "cli":
            continue
        out += [f"{m} imports {d} ({pkg} may not import {package_of(d)})" for d in sorted(deps)
                if package_of(d) != pkg and package_of(d) not in LAYERS[pkg]]
    return out


def engine_surface_violations() -> list[str]:
    """api/ modules that reach into the engine's scheduler (attribute `.scheduler`)."""
    out = []
    for f in sorted((PKG / "api").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "scheduler":
                out.append(f"{f.relative_to(PKG.parent)}:{node.lineno} reads .scheduler")
    return out


def size_violations() -> list[str]:
    return [f"{f.relative_to(PKG.parent)}: {n} lines" for f in sorted(PKG.rglob("*.py"))
            if (n := len(f.read_text().splitlines())) > MAX_LINES]


def problems(g: dict[str, set[str]]) -> list[str]:
    return ([" -> ".join(c) for c in cycles(g)] + cycles_of_packages(g) + layer_violations(g)
            + engine_surface_violations() + size_violations())


def cycles_of_packages(g: dict[str, set[str]]) -> list[str]:
    return ["package cycle: " + " -> ".join(c) for c in cycles(package_graph(g))]


def main(argv: list[str]) -> int:
    g = graph()
    found = problems(g)
    if "--graph" in argv:
        used = package_graph(g)
        print("package: may import  [imports now]")
        for pkg in LAYERS:
            allowed = "anything" if pkg == "cli" else ", ".join(sorted(LAYERS[pkg])) or "-"
            print(f"  {pkg}: {allowed}  [{', '.join(sorted(used.get(pkg, ()))) or '-'}]")
    print(f"{len(g)} modules, {sum(map(len, g.values()))} import edges: "
          f"{'OK' if not found else str(len(found)) + ' problem(s)'}")
    for p in found:
        print("  " + p)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
