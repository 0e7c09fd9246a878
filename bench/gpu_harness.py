"""The frame of bench/gpu.py: phases under one time budget with the JSON rewritten after each,
the environment record, logging (INFO, its tail kept in the JSON), the tables' number format."""
from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import logging
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from bench import gpu_parts as P
from bench.gpu_env import free_gib
from bench.harness import Table, Timer

PHASES = ("model", "correctness", "gemm", "decode", "prefill", "flashinfer", "serving", "capacity", "block_causal")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def gpu_cell(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def print_table(headers: list[str], rows: list[list]) -> None:
    """A markdown table (harness.Table), floats to 3 significant digits below 10, one decimal above."""
    table = Table(headers, cell=gpu_cell)
    for r in rows:
        table.row(*r)


class TailHandler(logging.Handler):
    """Keeps the last `n` formatted records (worker messages such as the graph capture summary,
    warnings, tracebacks) so that they land in the JSON, not only on a console that may be cut."""

    def __init__(self, n: int = 200):
        super().__init__(logging.INFO)
        self.lines: collections.deque[str] = collections.deque(maxlen=n)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:   # never let logging break a phase
            pass


def setup_logging() -> TailHandler:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr, force=True)
    for noisy in ("httpx", "httpcore"):     # one line per health poll and request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    tail = TailHandler()
    tail.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(tail)
    return tail


def file_tail(path: Path, chars: int = 3000) -> str:
    """The end of a log file that is about to be deleted with its temporary folder."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - chars))
            return fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<unreadable: {exc}>"


class Bench:
    """Phases under one time budget; the JSON is rewritten after every phase."""

    def __init__(self, out: Path, budget_s: float, device: torch.device, only: set[str] | None = None,
                 log_tail: TailHandler | None = None):
        self.out, self.budget, self.device, self.only, self.log_tail = out, budget_s, device, only, log_tail
        self.t0 = time.monotonic()
        self.res: dict = {"meta": {}, "phase_s": {}, "memory_gib": {}, "skipped": [], "errors": {}}
        out.parent.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def wanted(self, name: str) -> bool:
        return self.only is None or name in self.only

    def save(self) -> None:
        self.res["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        if self.log_tail is not None:
            self.res["log_tail"] = list(self.log_tail.lines)
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(self.res, indent=2, default=str))
        tmp.replace(self.out)

    def skip(self, note: str) -> None:
        self.res["skipped"].append(note)
        print(f"\n[skipped] {note}", flush=True)

    def phase(self, name: str, fn, need_s: float = 0.0):
        if not self.wanted(name):
            self.skip(f"{name}: not in --only")
            self.save()
            return None
        if self.left() < need_s:
            self.skip(f"{name}: {max(0.0, self.left()):.0f} s of the time budget left, needs ~{need_s:.0f} s")
            self.save()
            return None
        print(f"\n## {name} (t = {time.monotonic() - self.t0:.0f} s)\n", flush=True)
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        value = None
        with Timer() as t:
            try:
                value = fn()
                self.res[name] = value
            except Exception as exc:
                traceback.print_exc()
                self.res["errors"][name] = f"{type(exc).__name__}: {exc}"[:1000]
                self.res.setdefault("tracebacks", {})[name] = traceback.format_exc()[-4000:]
                P.free_device_memory(self.device)
        self.res["phase_s"][name] = round(t.s, 2)
        if cuda:
            self.res["memory_gib"][name] = {
                "peak_allocated": torch.cuda.max_memory_allocated(self.device) / 2**30,
                "allocated_after": torch.cuda.memory_allocated(self.device) / 2**30}
        self.save()
        return value


def env_info(device: torch.device, dtype: torch.dtype, cfg: dict, sh: P.Shapes, smoke: bool) -> dict:
    try:
        from importlib.metadata import version
        fi = version("flashinfer-python")
    except Exception:
        fi = None
    cuda = device.type == "cuda"
    tmp = tempfile.gettempdir()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if cuda else None,
            "gpu_memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30 if cuda else None,
            "flashinfer": fi, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            # the serving checkpoint (3.8 GB at full width) goes to tmp; worker queues use /dev/shm
            "tmp_dir": tmp, "tmp_free_gib": free_gib(tmp), "shm_free_gib": free_gib("/dev/shm"),
            "dtype": str(dtype), "smoke": smoke, "config": cfg, "shapes": dataclasses.asdict(sh), "argv": sys.argv}
