"""Keeping a long-running worker's resident memory flat (docs/reliability.md, "Worker memory").

On CPU, bf16/fp16 matmuls go through oneDNN, which keeps a compiled kernel for every input shape
it has seen in two LRU caches: its own primitive cache and ideep's (PyTorch's wrapper), 1024
entries each by default, about 0.3 MB an entry. A worker's packed batches take a new token count
almost every iteration, so under mixed traffic both caches fill for hours: a 10-minute soak grew
a worker by 82 MB and in-process tests by 400 MB, with no Python object growing. Both libraries
read their capacity from the environment on first use, so bounding them means setting it before
the worker's first forward. The hot shapes (decode batches) repeat and stay cached.

What remains is heap fragmentation from activations of varying sizes: freed, but held by glibc
malloc. An idle worker hands it back with malloc_trim, at most every `interval_s`.

While it works, the opposite is wanted: glibc serves every allocation above its mmap threshold
(128 KB at first) with a fresh mapping and gives freed heap tops back to the OS above its trim
threshold, so each forward's activations were page-faulted in anew: about 5,000 faults and up to
17 % of a batch-32 forward of the demo model (docs/benchmarks.md §9). `hold_freed_memory` raises
both thresholds, so freed activations are reused; the idle trim still returns them. Single
buffers above 32 MB (glibc's ceiling for the mmap threshold: wide models' MLP activations) are
still mapped afresh.
"""
from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Callable

# oneDNN's primitive cache and ideep's computation cache (both LRU, both read once, lazily).
KERNEL_CACHE_ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(entries: int, environ=os.environ) -> None:
    """Cap both per-shape kernel caches at `entries` each (0: leave the libraries' defaults). Call
    before the process's first CPU matmul."""
    if entries > 0:
        for name in KERNEL_CACHE_ENV:
            environ[name] = str(entries)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD_MAX = 32 << 20                     # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def hold_freed_memory(mb: int) -> bool:
    """Let glibc keep up to `mb` MB of freed memory for reuse (0: leave its defaults). True when set;
    False where there is no glibc mallopt."""
    if mb <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    size = min(mb << 20, 2**31 - 1)               # mallopt takes a C int
    return bool(mallopt(M_TRIM_THRESHOLD, size)) and bool(mallopt(M_MMAP_THRESHOLD, min(size, MMAP_THRESHOLD_MAX)))


def glibc_malloc_trim() -> Callable[[], None] | None:
    """glibc's malloc_trim(0), or None where there is none (other C libraries, other systems)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: fn(0)


class IdleTrim:
    """Trim the heap when the worker has just gone idle after work, at most every `interval_s`
    (a trim walks the heap: milliseconds, never inside an iteration)."""

    def __init__(self, interval_s: float, trim: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.trim = trim if trim is not None else (glibc_malloc_trim() if interval_s > 0 else None)
        self.clock = clock
        self.last = clock()
        self.worked = False          # work done since the last trim
        self.count = 0

    def turn(self, busy: bool) -> bool:
        """Called every loop turn; True when it trimmed."""
        if busy:
            self.worked = True
            return False
        if not self.worked or self.trim is None or self.clock() - self.last < self.interval_s:
            return False
        self.trim()
        self.last, self.worked = self.clock(), False
        self.count += 1
        return True
