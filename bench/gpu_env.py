"""What a bench/gpu.py run will import, recorded before it starts (scripts/gpu_run.sh writes it to
$OUT/gpu_info.txt): each imported distribution's version and origin, known incompatibilities, free space.

    PYTHONPATH=src python -m bench.gpu_env        # exit 1 when the serving stack cannot be imported
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench.harness import parser

# What the run imports: the bench itself, the offline engine, the server and the load generator.
MODULES = ("torch", "numpy", "safetensors", "tokenizers", "transformers", "jinja2", "httpx", "anyio", "pydantic",
           "starlette", "uvicorn", "prometheus_client", "dllm_server.cli", "dllm_server.llm", "dllm_server.api.app",
           "loadgen.cli", "loadgen.run")
SERVING = ("pydantic", "starlette", "uvicorn", "httpx", "anyio", "dllm_server.api.app", "loadgen.run")
NEED_GIB = {"tmp": 6.0, "shm": 1.0}    # the 3.8 GB serving checkpoint (+ margin); worker queues


def major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return -1


def checks(versions: dict[str, str]) -> list[str]:
    """Known incompatibilities, as warnings (pure: versions in, messages out)."""
    out = []
    if "anyio" in versions and major(versions["anyio"]) < 4:
        out.append(f"anyio {versions['anyio']} < 4: starlette >= 0.40 needs anyio >= 4 (carry .whl)")
    if "pydantic" in versions and major(versions["pydantic"]) < 2:
        out.append(f"pydantic {versions['pydantic']} < 2: the API models need pydantic 2 (carry .whl)")
    return out


def imported_distributions() -> dict[str, tuple[str, str]]:
    """{distribution: (version, folder its module was imported from)} over every top-level module
    loaded; a module that several installed distributions claim is marked so."""
    owners = md.packages_distributions()
    out = {}
    for name, mod in list(sys.modules.items()):
        if "." in name or name.startswith("_") or mod is None:
            continue
        file = getattr(mod, "__file__", None)
        where = "?" if not file else str(Path(file).parent.parent if Path(file).name == "__init__.py"
                                         else Path(file).parent)
        claimed = owners.get(name, ())
        for dist in claimed:
            if dist in out:
                continue
            try:
                version = md.version(dist)
            except md.PackageNotFoundError:
                continue
            out[dist] = (version, where + (f"; module {name} also claimed by {len(claimed) - 1} other(s)"
                                           if len(claimed) > 1 else ""))
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


def free_gib(path: str) -> float | None:
    try:
        return shutil.disk_usage(path).free / 2**30
    except OSError:
        return None


def main() -> int:
    parser(__doc__).parse_args()
    failed = {}
    for m in MODULES:
        try:
            importlib.import_module(m)
        except Exception as exc:   # report every failure, not just the first
            failed[m] = f"{type(exc).__name__}: {exc}"
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    dists = imported_distributions()
    for dist, (version, where) in dists.items():
        print(f"  {dist}=={version}  ({where})")
    warnings = checks({d.lower().replace("_", "-"): v for d, (v, _) in dists.items()})
    for m, why in failed.items():
        warnings.append(f"cannot import {m}: {why}")
    proxies = [k for k in os.environ if k.lower() in ("http_proxy", "https_proxy", "all_proxy")]
    print(f"proxy variables set: {proxies or 'none'}; NO_PROXY={os.environ.get('NO_PROXY', '')!r}")
    tmp = tempfile.gettempdir()
    for label, path in (("tmp", tmp), ("shm", "/dev/shm")):
        gib = free_gib(path)
        print(f"free space {label} ({path}): {'?' if gib is None else f'{gib:.1f} GiB'}")
        if gib is not None and gib < NEED_GIB[label]:
            warnings.append(f"{path} has {gib:.1f} GiB free, the run needs ~{NEED_GIB[label]:.0f} GiB")
    for w in warnings:
        print(f"WARNING: {w}")
    bad = [m for m in failed if m in SERVING]
    print("serving stack: " + ("OK" if not bad else f"BROKEN ({', '.join(bad)}): the capacity phase will fail"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
