"""Building and running the CPU image with podman, without a Docker daemon or a registry.

Everything specific to this stand-in lives here, never in the Dockerfiles:
- podman gets its own containers.conf and storage.conf (env CONTAINERS_CONF / CONTAINERS_STORAGE_CONF),
  so the system's podman set-up is neither needed nor touched: runc (crun refuses the cgroup set-up
  of these machines), cgroupfs, and `default_ulimits = []` (podman's default raises RLIMIT_NOFILE
  and NPROC above what the sandbox allows);
- the `python:3.11...-slim-bookworm` base cannot be pulled, so a Debian root filesystem made with
  `debootstrap --variant=minbase` (that python, venv, CA certificates, `python` -> python3.X and
  this machine's CA bundle so pip inside the build reaches the package registry) is imported and
  passed as `--build-arg PYTHON_IMAGE`;
- the CPU torch wheel is not on the public index the Dockerfile names, but this machine's pip
  finds it locally: `pip download` puts it and its dependencies in a folder of PEP 503 pages,
  mounted into the build and passed as `--build-arg TORCH_INDEX_URL=file:///...` (a fixed URL,
  so the torch layer stays cached between runs).
The base image, the index and podman's storage (with the build cache) are kept under
~/.cache/dllm-server/podman (or $DLLM_PODMAN_CACHE) and rebuilt when missing.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from dllm_server.server_process import ServerProcess, free_port

from .dockerctx import DOCKERFILES, REPO, arg_defaults, parse_dockerfile, stages

CACHE = Path(os.environ.get("DLLM_PODMAN_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dllm-server" / "podman")
# podman's run-time state (locks, container state) must not survive a reboot, unlike its storage.
RUN_DIR = Path("/run/dllm-server-podman")
INDEX_MOUNT = "/stand-in-index"
TOOLS = ("podman", "runc", "debootstrap")
TEST_IMAGE = "localhost/dllm-server-test:cpu"
BUILD_CACHE_IMAGE = "localhost/dllm-server-test:build"   # keeps the build stage (torch layer) cached
STAND_IN_REPO = "localhost/dllm-server-test/stand-in-python"
# what the image test measured, printed at the end of the run (tests/docker/conftest.py)
METRICS: dict[str, str] = {}

CONTAINERS_CONF = """\
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
tmp_dir = "{run}/libpod"
"""
STORAGE_CONF = """\
[storage]
driver = "overlay"
graphroot = "{cache}/storage"
runroot = "{run}/storage"
"""


def unavailable() -> str | None:
    """Why the image cannot be built here (the test skips with this), or None."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (f"{', '.join(missing)} not installed: apt-get install podman runc debootstrap "
                "(.ci/run installs them) to build and run the CPU image")
    if os.geteuid() != 0:
        return "building the CPU image with podman and debootstrap needs root"
    return None


def cpu_build_args() -> dict[str, str]:
    """Defaults of docker/Dockerfile.cpu's ARGs (global and per stage)."""
    out: dict[str, str] = {}
    for stage in stages(parse_dockerfile(DOCKERFILES["cpu"])):
        out.update(arg_defaults(stage))
    return out


class Podman:
    """podman with the helper's configuration; every call is bounded by a timeout."""

    def __init__(self) -> None:
        for d in (CACHE, RUN_DIR):
            d.mkdir(parents=True, exist_ok=True)
        conf = {"cache": CACHE, "run": RUN_DIR}
        (CACHE / "containers.conf").write_text(CONTAINERS_CONF.format(**conf))
        (CACHE / "storage.conf").write_text(STORAGE_CONF.format(**conf))
        self.env = {**os.environ, "CONTAINERS_CONF": str(CACHE / "containers.conf"),
                    "CONTAINERS_STORAGE_CONF": str(CACHE / "storage.conf")}

    def __call__(self, *args: str, timeout: float = 120, check: bool = True, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
        if check and proc.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
        return proc

    def popen(self, *args: str, log_path: Path) -> subprocess.Popen:
        with open(log_path, "w") as log:
            return subprocess.Popen(["podman", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0

    def inspect(self, what: str, name: str) -> dict:
        return json.loads(self(what, "inspect", name).stdout)[0]


@contextlib.contextmanager
def cache_lock():
    """One test run at a time sets up the cache and builds (concurrent runs share the storage)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- stand-in base image
def ca_bundle() -> Path:
    for p in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if p and Path(p).is_file():
            return Path(p)
    raise RuntimeError("no CA bundle found (PIP_CERT, SSL_CERT_FILE, /etc/ssl/certs/ca-certificates.crt)")


def apt_mirror(suite: str) -> str | None:
    """The Debian mirror this machine's apt uses for `suite` (None: debootstrap's default)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for block in path.read_text().split("\n\n"):
            fields = dict(line.split(":", 1) for line in block.splitlines()
                          if ":" in line and not line.startswith(("#", " ")))
            fields = {k.strip(): v.split() for k, v in fields.items()}
            if suite in fields.get("Suites", []) and "main" in fields.get("Components", []) and fields.get("URIs"):
                return fields["URIs"][0]
    lists = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]
    for path in (p for p in lists if p.is_file()):
        for line in path.read_text().splitlines():
            words = re.sub(r"\[[^]]*\]", "", line).split()
            if len(words) >= 4 and words[0] == "deb" and words[2] == suite and "main" in words[3:]:
                return words[1]
    return None


def base_python() -> tuple[str, str]:
    """(python X.Y, Debian suite) of the Dockerfile's default PYTHON_IMAGE."""
    base = cpu_build_args()["PYTHON_IMAGE"]
    m = re.fullmatch(r"python:(\d+\.\d+)[\d.]*-slim-(\w+)", base)
    if not m:
        raise RuntimeError(f"no stand-in recipe for PYTHON_IMAGE={base}")
    return m.group(1), m.group(2)


def stand_in_recipe() -> tuple[str, str, list[str]]:
    """(image reference, Debian suite, packages) standing in for the default PYTHON_IMAGE."""
    py, suite = base_python()
    # python3-distutils: python3.X-venv depends on it through a virtual package debootstrap cannot resolve
    packages = [f"python{py}", f"python{py}-venv", "python3-distutils", "ca-certificates"]
    # the tag changes with the recipe and the CA bundle, so a stale base is rebuilt, not reused
    digest = hashlib.sha256(repr((packages, suite)).encode() + ca_bundle().read_bytes()).hexdigest()[:12]
    return f"{STAND_IN_REPO}:{py}-{suite}-{digest}", suite, packages


def ensure_stand_in_base(podman: Podman, log) -> tuple[str, float]:
    """The stand-in base image (built when missing) and the seconds it took (0 when cached)."""
    ref, suite, packages = stand_in_recipe()
    if podman.exists(ref):
        return ref, 0.0
    start = time.monotonic()
    py = packages[0].removeprefix("python")
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as tmp:
        root = Path(tmp) / "root"
        mirror = apt_mirror(suite)
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(root),
               *([mirror] if mirror else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        log(f"debootstrap {suite}: exit {proc.returncode} in {time.monotonic() - start:.0f} s")
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
        (root / "usr/bin/python").unlink(missing_ok=True)
        (root / "usr/bin/python").symlink_to(f"python{py}")
        shutil.copyfile(ca_bundle(), root / "etc/ssl/certs/ca-certificates.crt")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):   # debs and indexes: ~90 MB
            shutil.rmtree(root / junk, ignore_errors=True)
            (root / junk).mkdir(parents=True)
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tar), "."], check=True, timeout=600)
        podman("import", "--change", "ENV LANG=C.UTF-8", "--change", f'CMD ["python{py}"]', str(tar), ref,
               timeout=600)
    for old in podman("images", "--format", "{{.Repository}}:{{.Tag}}", STAND_IN_REPO).stdout.split():
        if old != ref:
            podman("rmi", old, check=False)
    return ref, time.monotonic() - start


# --------------------------------------------------------------------------- local torch index
def project_name(wheel: str) -> str:
    return re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()   # PEP 503 normalisation


def ensure_torch_index(log) -> tuple[Path, float]:
    """A PEP 503 folder with the Dockerfile's torch and its dependencies (built when missing)."""
    version = cpu_build_args()["TORCH_VERSION"]
    index = CACHE / f"index-torch-{version}"
    if (index / "simple" / "torch" / "index.html").is_file():
        return index, 0.0
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix="index-"))
    py, _ = base_python()
    # the machine's pip configuration is what finds the CPU wheel on this disk
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", py,
           "--dest", str(tmp / "files"), f"torch=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    pages: dict[str, list[str]] = {}
    for wheel in sorted(p.name for p in (tmp / "files").iterdir()):
        sha = hashlib.sha256((tmp / "files" / wheel).read_bytes()).hexdigest()
        pages.setdefault(project_name(wheel), []).append(
            f'<a href="../../files/{urllib.parse.quote(wheel)}#sha256={sha}">{wheel}</a><br>')
    for name, links in pages.items():
        (tmp / "simple" / name).mkdir(parents=True)
        (tmp / "simple" / name / "index.html").write_text(
            "<!DOCTYPE html>\n<html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    tmp.chmod(0o755)
    shutil.rmtree(index, ignore_errors=True)
    tmp.rename(index)
    log(f"torch index: {', '.join(sorted(pages))} in {time.monotonic() - start:.0f} s")
    return index, time.monotonic() - start


# --------------------------------------------------------------------------- build
def build_command(dockerfile: Path, base: str, index: Path, tag: str, *extra: str) -> list[str]:
    # --format docker: the OCI format has no HEALTHCHECK and podman drops it (with a warning);
    # --network host: the build's pip reaches the package registry the way the host does.
    return ["build", "--format", "docker", "--network", "host", "--volume", f"{index}:{INDEX_MOUNT}:ro",
            "--file", str(dockerfile), "--build-arg", f"PYTHON_IMAGE={base}",
            "--build-arg", f"TORCH_INDEX_URL=file://{INDEX_MOUNT}/simple", "--tag", tag, *extra, str(REPO)]


def build_image(podman: Podman, base: str, index: Path, log_path: Path, dockerfile: Path = DOCKERFILES["cpu"],
                tag: str = TEST_IMAGE, timeout: float = 1500) -> float:
    """Build `dockerfile` from the checkout; the seconds it took. RuntimeError with the log's tail."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(["podman", *build_command(dockerfile, base, index, tag)], env=podman.env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"podman build -f {dockerfile.relative_to(REPO)} exited {proc.returncode}:\n"
                           + log_path.read_text(errors="replace")[-4000:])
    return time.monotonic() - start


def keep_build_cache(podman: Podman, base: str, index: Path) -> None:
    """Tag the build stage (cached, so this takes a second) so pruning keeps the torch layer, then
    drop what earlier runs left untagged: the cache holds one build, not one per run."""
    podman(*build_command(DOCKERFILES["cpu"], base, index, BUILD_CACHE_IMAGE, "--target", "build", "--quiet"),
           timeout=600)
    podman("image", "prune", "--force", timeout=600, check=False)


def layer_sizes(podman: Podman, image: str) -> list[tuple[int, str]]:
    """(bytes, what) of the image's non-empty layers, largest first: `COPY ... in /opt/venv` -> /opt/venv."""
    out = []
    for row in json.loads(podman("history", "--format", "json", image).stdout):
        created = (row.get("CreatedBy") or row.get("createdBy") or "").split("#(nop) ")[-1].strip()
        m = re.fullmatch(r"(COPY|ADD) (?:dir|file):\w+ in (\S+)", created)
        what = ("base" if m.group(1) == "ADD" and m.group(2) == "/" else m.group(2)) if m else created[:40]
        if row["size"]:
            out.append((row["size"], what))
    return sorted(out, reverse=True)


# --------------------------------------------------------------------------- containers
def run_server(podman: Podman, image: str, name: str, *args: str, log_path: Path, env: dict | None = None,
               volumes: tuple[str, ...] = ()) -> ServerProcess:
    """`podman run` attached, so the process exits with the container's exit code; the image's
    port 8000 is published on a free loopback port. Not started with --init: the server is PID 1."""
    port = free_port()
    cmd = ["run", "--rm", "--name", name, "--publish", f"127.0.0.1:{port}:8000", "--shm-size", "2g",
           *(f"--env={k}={v}" for k, v in (env or {}).items()), *(f"--volume={v}" for v in volumes), image, *args]
    return ServerProcess(podman.popen(*cmd, log_path=log_path), f"http://127.0.0.1:{port}", str(log_path))


def stop_container(podman: Podman, server: ServerProcess, name: str, grace_s: int) -> tuple[int | None, float]:
    """`podman stop` (STOPSIGNAL, then SIGKILL after `grace_s`): the exit code and the seconds it took."""
    start = time.monotonic()
    podman("stop", "--time", str(grace_s), name, timeout=grace_s + 60, check=False)
    elapsed = time.monotonic() - start
    try:
        return server.proc.wait(30), elapsed
    except subprocess.TimeoutExpired:
        return None, elapsed


def remove_container(podman: Podman, server: ServerProcess | None, name: str) -> None:
    podman("rm", "--force", "--ignore", "--time", "0", name, timeout=120, check=False)
    if server is not None:
        server.stop(signal.SIGKILL, timeout=10)   # the attached podman client, if still there
