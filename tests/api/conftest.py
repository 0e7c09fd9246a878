"""A real `dllm-server serve` subprocess on a free loopback port, spoken to over HTTP."""
from __future__ import annotations

import itertools

import pytest

from dllm_server.server_process import ServerProcess as Server, serve, wait_healthy  # noqa: F401 (re-exported)


_logs = itertools.count()
_started: list[Server] = []


def start_server(model: str | None, *flags: str, tmp_path, env: dict | None = None, wait: bool = True) -> Server:
    s = serve(model, "--threads-per-worker", "1", *flags, log_path=tmp_path / f"server-{next(_logs)}.log",
              env=env, wait=wait)
    _started.append(s)
    return s


@pytest.fixture(autouse=True, scope="session")
def _no_leftover_servers():
    """A test that fails before stopping its server must not leave it (and its workers) running."""
    yield
    for s in _started:
        if s.proc.poll() is None:
            s.stop(timeout=10)


@pytest.fixture(scope="session")
def server(tiny_llada, tmp_path_factory):
    s = start_server(tiny_llada, "--block-length", "8", "--served-model-name", "tiny", "--num-workers", "1",
                     tmp_path=tmp_path_factory.mktemp("server"))
    yield s
    s.stop()
