"""Keeps a long-running worker's resident memory flat (docs/reliability.md, "Worker memory"): bounded per-shape
kernel caches, freed activations reused while working, the heap trimmed when idle."""
from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Callable

# oneDNN's primitive cache and ideep's computation cache: each library reads its capacity once, on first use.
KERNEL_CACHE_ENV = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(entries: int, environ=os.environ) -> None:
    """Cap both per-shape kernel caches at `entries` each (0: the defaults); call before the first CPU matmul."""
    if entries > 0:
        for name in KERNEL_CACHE_ENV:
            environ[name] = str(entries)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD_MAX = 32 << 20                     # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def hold_freed_memory(mb: int) -> bool:
    """Let glibc keep up to `mb` MB of freed memory for reuse (0: its defaults); False where there is no mallopt."""
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
    """Trim the heap (milliseconds) when the worker has just gone idle after work, at most every `interval_s`."""

    def __init__(self, interval_s: float, trim: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.trim = trim if trim is not None else (glibc_malloc_trim() if interval_s > 0 else None)
        self.clock = clock
        self.last = clock()
        self.worked = False
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
