"""The reliability suite: real servers attacked, overloaded and broken on purpose. Every test
records its figures (with the machine's condition); they are printed at the end of the run, and
written as JSON to $DLLM_RELIABILITY_JSON when it is set. `make soak` runs the long form
(DLLM_SOAK_S=600 on the demo model)."""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import resource

import pytest

from dllm_server.server_process import ServerProcess, serve

from .tools import machine

FIGURES: list[dict] = []
_logs = itertools.count()
_started: list[ServerProcess] = []


def start(model: str | None, *flags: str, tmp_path, wait: bool = True, env: dict | None = None) -> ServerProcess:
    s = serve(model, "--threads-per-worker", "1", *flags, log_path=tmp_path / f"server-{next(_logs)}.log",
              wait=wait, env=env)
    _started.append(s)
    return s


@pytest.fixture(autouse=True, scope="session")
def _no_leftover_servers():
    # The overload's open-loop client holds thousands of connections at once: the soft limit of
    # open files (often 1024) would turn them into client-side errors.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for s in _started:
        if s.proc.poll() is None:
            s.stop(timeout=10)


@pytest.fixture
def figures(request):
    """record(what, **numbers): one line of the suite's figures."""
    def record(what: str, **numbers) -> None:
        row = {"test": request.node.name, "what": what, **numbers, "machine": machine()}
        FIGURES.append(row)
        print(json.dumps(row), flush=True)
    return record


def pytest_terminal_summary(terminalreporter):
    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    for row in FIGURES:
        rest = {k: v for k, v in row.items() if k not in ("test", "what", "machine")}
        terminalreporter.write_line(f"{row['what']}: {json.dumps(rest)}  [{row['machine']}]")
    path = os.environ.get("DLLM_RELIABILITY_JSON")
    if path:
        with open(path, "w") as f:
            json.dump(FIGURES, f, indent=1)
