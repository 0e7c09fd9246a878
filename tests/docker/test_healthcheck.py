"""docker/healthcheck.py: exit status against a local stand-in server, and port discovery."""
from __future__ import annotations

import http.server
import importlib.util
import subprocess
import sys
import threading

import pytest

from .dockerctx import DOCKER_DIR

SCRIPT = DOCKER_DIR / "healthcheck.py"


def load():
    spec = importlib.util.spec_from_file_location("dllm_healthcheck", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hc = load()


@pytest.fixture
def server():
    state = {"status": 200, "auth": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            state["auth"].append(self.headers.get("Authorization"))
            code = state["status"] if self.path == "/health" else 404
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state["port"] = httpd.server_address[1]
    yield state
    httpd.shutdown()
    httpd.server_close()


def run_script(env_url: str) -> int:
    return subprocess.run([sys.executable, str(SCRIPT)], env={"DLLM_HEALTHCHECK_URL": env_url, "PATH": ""},
                          capture_output=True, timeout=30).returncode


def test_exit_status(server):
    url = f"http://127.0.0.1:{server['port']}/health"
    assert run_script(url) == 0
    server["status"] = 503          # engine loading or draining
    assert run_script(url) == 1


def test_connection_refused():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert run_script(f"http://127.0.0.1:{port}/health") == 1


def test_bearer_key_sent(server):
    ok, _ = hc.probe(f"http://127.0.0.1:{server['port']}/health", api_key="k1")
    assert ok and server["auth"] == ["Bearer k1"]


@pytest.mark.parametrize("argv, url", [
    (["/opt/venv/bin/python3", "/opt/venv/bin/dllm-server", "serve", "--host", "0.0.0.0"],
     "http://127.0.0.1:8000/health"),
    (["dllm-server", "serve", "/models", "--host", "0.0.0.0", "--port", "9000"], "http://127.0.0.1:9000/health"),
    (["dllm-server", "serve", "--port=9001", "--host=::"], "http://127.0.0.1:9001/health"),
    (["dllm-server", "serve", "--host", "::1"], "http://[::1]:8000/health"),
    ([], "http://127.0.0.1:8000/health"),
])
def test_url_from_server_command_line(argv, url):
    assert hc.health_url(argv, {}) == url


def test_server_process_discovery(tmp_path):
    def proc(pid, argv):
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")

    proc(3, ["python", "-c", "from multiprocessing.spawn import spawn_main"])   # a worker
    proc(7, ["/opt/venv/bin/python3", "/opt/venv/bin/dllm-server", "serve", "--port", "8100"])
    (tmp_path / "self").mkdir()
    argv = hc.server_argv(str(tmp_path))
    assert argv[1].endswith("dllm-server") and hc.flag_value(argv, "--port") == "8100"
    # with `--init`, PID 1 is docker-init carrying the same arguments: either one gives the port
    proc(1, ["/sbin/docker-init", "--", "dllm-server", "serve", "--port", "8100"])
    assert hc.flag_value(hc.server_argv(str(tmp_path)), "--port") == "8100"
    assert hc.server_argv(str(tmp_path / "missing")) == []


@pytest.mark.parametrize("argv, expected", [
    (["python", "-m", "dllm_server.cli", "serve"], True),
    (["/opt/venv/bin/dllm-server", "serve", "/models"], True),
    (["dllm-server", "make-tiny-model", "/tmp/x"], False),
    (["python", "-c", "import x"], False),
])
def test_is_server_argv(argv, expected):
    assert hc.is_server_argv(argv) is expected
