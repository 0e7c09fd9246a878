"""A worker's memory stays flat (worker/memory.py): oneDNN's per-shape kernel caches bounded, and
the heap trimmed when the worker goes idle."""
import json
import subprocess
import sys
from pathlib import Path

from dllm_server.config import ServerConfig
from dllm_server.worker.memory import KERNEL_CACHE_ENV, IdleTrim, bound_kernel_caches

# bf16 matmuls of 600 distinct token counts, as a worker's packed batches of mixed traffic are:
# the benchmark's own script (bench/worker_memory.py), which prints the RSS growth after the first
# 150 (when a bounded cache is full).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from worker_memory import MATMULS  # noqa: E402


def growth_mb(entries: int) -> float:
    out = subprocess.run([sys.executable, "-c", MATMULS, str(entries)], capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.splitlines()[-1])["growth_mb"]


def test_bounded_kernel_caches_keep_bf16_matmuls_of_many_shapes_flat():
    unbounded, bounded = growth_mb(0), growth_mb(ServerConfig().cpu_kernel_cache_entries)
    assert unbounded > 100, f"the libraries' caches no longer grow ({unbounded:.1f} MB): is the bound still needed?"
    assert bounded < 30, (bounded, unbounded)


def test_bound_kernel_caches_sets_both_libraries_capacity():
    env: dict[str, str] = {}
    bound_kernel_caches(0, env)
    assert env == {}                                   # 0: the libraries' defaults
    bound_kernel_caches(64, env)
    assert env == {name: "64" for name in KERNEL_CACHE_ENV}
    assert ServerConfig().worker_config().cpu_kernel_cache_entries == ServerConfig().cpu_kernel_cache_entries > 0


def test_idle_trim_trims_once_after_work_at_most_every_interval():
    now, trims = [0.0], []
    t = IdleTrim(10.0, trim=lambda: trims.append(now[0]), clock=lambda: now[0])
    now[0] = 20.0
    assert not t.turn(busy=False)                      # never worked: nothing to hand back
    assert not t.turn(busy=True)
    assert t.turn(busy=False) and trims == [20.0]      # just gone idle
    assert not t.turn(busy=False)                      # still idle: once is enough
    now[0] = 25.0
    t.turn(busy=True)
    assert not t.turn(busy=False)                      # worked again, but within the interval
    now[0] = 30.0
    assert t.turn(busy=False) and trims == [20.0, 30.0]
    off = IdleTrim(0.0)
    off.turn(busy=True)
    assert off.trim is None and not off.turn(busy=False)


def test_glibc_malloc_trim_runs_here():
    t = IdleTrim(1e-9)
    if t.trim is None:                                 # not glibc: the worker simply never trims
        return
    t.turn(busy=True)
    assert t.turn(busy=False) and t.count == 1
