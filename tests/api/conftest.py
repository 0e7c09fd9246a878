"""A real `dllm-server serve` subprocess on a free loopback port, spoken to over HTTP."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log_path: str

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def start_server(model: str | None, *flags: str, tmp_path, env: dict | None = None, wait: bool = True) -> Server:
    port = free_port()
    log_path = str(tmp_path / f"server-{port}.log")
    cmd = [sys.executable, "-m", "dllm_server.cli", "serve", *([model] if model else []), "--port", str(port),
           "--threads-per-worker", "1", *flags]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    server = Server(proc, f"http://127.0.0.1:{port}", log_path)
    if wait:
        wait_healthy(server)
    return server


def wait_healthy(server: Server, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not healthy after {timeout} s:\n{server.log()}")


@pytest.fixture(scope="session")
def server(tiny_llada, tmp_path_factory):
    s = start_server(tiny_llada, "--block-length", "8", "--served-model-name", "tiny", "--num-workers", "1",
                     tmp_path=tmp_path_factory.mktemp("server"))
    yield s
    s.stop()
