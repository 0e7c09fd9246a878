#!/usr/bin/env python3
"""Container health probe for dllm-server: exit 0 when GET /health answers 200, else 1.

Standard library only (it runs inside the images with the server's own python). The port, the
bind address and an API key are read from the running server's command line (/proc/*/cmdline),
so `docker run IMAGE --port 9000` stays healthy without a matching change to HEALTHCHECK.
DLLM_HEALTHCHECK_URL overrides everything (e.g. http://127.0.0.1:9000/health).
"""
from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_PORT = 8000
# Idle, the server's /health runs a one-token request through a worker (a wedged worker fails it),
# so allow a few seconds; the Dockerfiles' HEALTHCHECK --timeout is 10s.
TIMEOUT_S = 8.0
WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]", "*"}


def flag_value(argv: list[str], flag: str) -> str | None:
    """Value of `flag` as argparse reads it (`--flag V` or `--flag=V`; the last one wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def is_server_argv(argv: list[str]) -> bool:
    """True for `dllm-server serve ...`, however it was started (console script or -m)."""
    for i, arg in enumerate(argv):
        name = os.path.basename(arg)
        if name == "dllm-server" or (arg == "-m" and i + 1 < len(argv) and argv[i + 1].startswith("dllm_server")):
            return "serve" in argv[i + 1:]
    return False


def server_argv(proc: str = "/proc") -> list[str]:
    """Command line of the oldest `dllm-server serve` process visible here ([] if none)."""
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        return []
    for pid in pids:
        try:
            with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
                raw = f.read()
        except OSError:
            continue
        argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
        if is_server_argv(argv):
            return argv
    return []


def health_url(argv: list[str], env: dict[str, str]) -> str:
    if env.get("DLLM_HEALTHCHECK_URL"):
        return env["DLLM_HEALTHCHECK_URL"]
    port = flag_value(argv, "--port") or str(DEFAULT_PORT)
    host = flag_value(argv, "--host") or "127.0.0.1"
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/health"


def probe(url: str, api_key: str | None = None, timeout: float = TIMEOUT_S) -> tuple[bool, str]:
    req = urllib.request.Request(url, method="GET")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (local URL)
            return resp.status == 200, f"{url} -> {resp.status}"
    except urllib.error.HTTPError as e:  # 503 while the engine loads or drains
        return False, f"{url} -> {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return False, f"{url} -> {e}"


def main() -> int:
    argv = server_argv()
    api_key = flag_value(argv, "--api-key") or os.environ.get("DLLM_API_KEY") or None
    ok, message = probe(health_url(argv, dict(os.environ)), api_key)
    print(message)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
