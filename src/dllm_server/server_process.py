"""`dllm-server serve` as a subprocess on a free loopback port, waited for on /health: shared by tests,
benchmarks and scripts."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str
    log_path: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal the server and wait, then SIGKILL whatever is left of its session: nothing may keep a GPU."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        return self.proc.returncode


def serve(model: str | Path | None, *flags: str, log_path: str | Path, env: dict | None = None, wait: bool = True,
          timeout_s: float = 120) -> ServerProcess:
    """`dllm-server serve [model] --port <free> *flags` in its own session, so a stop takes the whole group."""
    port = free_port()
    cmd = [sys.executable, "-m", "dllm_server.cli", "serve", *([str(model)] if model else []), "--port", str(port),
           *flags]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", str(log_path))
    if wait:
        try:
            wait_healthy(server, timeout_s)
        except BaseException:
            server.stop(signal.SIGKILL, timeout=5)
            raise
    return server


def wait_healthy(server: ServerProcess, timeout_s: float = 120) -> None:
    """Poll /health (never through an environment proxy) until 200; errors carry the tail of the log."""
    import httpx
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False) as client:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()[-4000:]}")
            try:
                if client.get(server.url + "/health", timeout=min(5.0, max(0.5, deadline - time.monotonic()))
                              ).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"server not healthy after {timeout_s:.0f} s:\n{server.log()[-4000:]}")
