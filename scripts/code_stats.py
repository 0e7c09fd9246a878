"""Lines of src per package: total, docstring and comment lines (their share), modules over 300
and 400 lines.

    python scripts/code_stats.py [--by-module] [--src OTHER_TREE/src/dllm_server]
"""
from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "dllm_server"


def doc_and_comment_lines(path: Path) -> tuple[int, int, int]:
    """(lines, docstring lines, comment lines); a line holding code and a trailing comment counts
    as a comment line too (it carries prose)."""
    text = path.read_text()
    lines = text.splitlines()
    doc = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                doc.update(range(body[0].lineno, body[0].end_lineno + 1))
    comments = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                if tok.type == tokenize.COMMENT}
    return len(lines), len(doc), len(comments - doc)


def main(argv: list[str]) -> None:
    global PKG
    if "--src" in argv:
        PKG = Path(argv[argv.index("--src") + 1]).resolve()
    by_pkg = defaultdict(lambda: [0, 0, 0, 0])
    rows = []
    for f in sorted(PKG.rglob("*.py")):
        n, d, c = doc_and_comment_lines(f)
        rel = f.relative_to(PKG)
        pkg = rel.parts[0] if len(rel.parts) > 1 else "(top level)"
        s = by_pkg[pkg]
        s[0] += n; s[1] += d; s[2] += c; s[3] += 1
        rows.append((str(rel), n, d, c))
    tot = [sum(v[i] for v in by_pkg.values()) for i in range(4)]
    print("| package | modules | lines | docstring lines | comment lines | prose share |\n|---|---|---|---|---|---|")
    for pkg, (n, d, c, m) in sorted(by_pkg.items()):
        print(f"| {pkg} | {m} | {n} | {d} | {c} | {100 * (d + c) / n:.1f} % |")
    print(f"| all | {tot[3]} | {tot[0]} | {tot[1]} | {tot[2]} | {100 * (tot[1] + tot[2]) / tot[0]:.1f} % |")
    print(f"\nmodules over 300 lines: {sum(r[1] > 300 for r in rows)}; over 400: {sum(r[1] > 400 for r in rows)}")
    if "--by-module" in argv:
        for rel, n, d, c in sorted(rows, key=lambda r: -(r[2] + r[3]) / max(r[1], 1)):
            print(f"  {rel}: {n} lines, {100 * (d + c) / max(n, 1):.0f} % prose")


if __name__ == "__main__":
    main(sys.argv[1:])
