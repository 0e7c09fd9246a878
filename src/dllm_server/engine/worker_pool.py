"""Worker processes: spawn (torch.multiprocessing, spawn context), one inbox and one outbox per
worker, a reader thread per outbox feeding the asyncio loop, liveness by process state, restart
and join. Holds no policy: deaths and messages are handed to callbacks on the loop.

This is the front process's one seam to the worker side: the only engine/ or api/ module that
imports from worker/ (the process entry point it spawns). Everything else crosses as messages."""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from dataclasses import dataclass

import torch.multiprocessing as mp

from ..config import ServerConfig
from ..launch import free_port
from ..messages import Shutdown, WorkerSpec
from ..worker.main import worker_main

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Slot:
    spec: WorkerSpec
    process: object
    inbox: object
    outbox: object


class WorkerPool:
    def __init__(self, config: ServerConfig, model_path: str, roles: list[str], devices: list[str],
                 loop: asyncio.AbstractEventLoop, on_messages, on_death):
        self.config = config
        self.worker_config = config.worker_config()     # workers get only what they need
        self.model_path = model_path
        self.roles = roles
        self.devices = devices
        self.loop = loop
        self.on_messages = on_messages      # (worker_id, list[msg]) on the loop
        self.on_death = on_death            # (worker_id, exitcode) on the loop
        self.ctx = mp.get_context("spawn")
        self.slots: dict[int, _Slot] = {}
        self._stopping = False
        # Leave a core to the front process: OpenMP threads that lose their core to it spin at
        # barriers, which on 2 cores made a 2-thread worker 15x slower (bench/http_vs_offline.py).
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.threads = config.threads_per_worker or max(1, (cores - 1) // len(roles))

    @property
    def uses_process_group(self) -> bool:
        return "prefill" in self.roles

    def start_all(self) -> None:
        port = free_port() if self.uses_process_group else 0
        for wid in range(len(self.roles)):
            self._start(wid, port)

    def _start(self, wid: int, port: int) -> None:
        peer_role = {"prefill": "decode", "decode": "prefill"}.get(self.roles[wid])
        peers = tuple(i for i, r in enumerate(self.roles) if r == peer_role)
        spec = WorkerSpec(wid, self.roles[wid], self.devices[wid], self.threads, self.model_path,
                          len(self.roles) if self.uses_process_group else 1, port, peers)
        inbox, outbox = self.ctx.Queue(), self.ctx.Queue()
        proc = self.ctx.Process(target=worker_main, args=(spec, self.worker_config, inbox, outbox),
                                name=f"dllm-worker-{wid}", daemon=True)
        proc.start()
        slot = _Slot(spec, proc, inbox, outbox)
        self.slots[wid] = slot
        threading.Thread(target=self._read, args=(slot,), name=f"dllm-outbox-{wid}", daemon=True).start()

    def restart(self, wid: int) -> list[int]:
        """Restart one worker, or all of them when they share a torch.distributed group (a
        group cannot re-admit a member). Returns the ids restarted."""
        ids = list(self.slots) if self.uses_process_group else [wid]
        for i in ids:
            self._kill(self.slots[i])
        port = free_port() if self.uses_process_group else 0
        for i in ids:
            self._start(i, port)
        return ids

    def send(self, wid: int, msg) -> None:
        self.slots[wid].inbox.put(msg)

    def pid(self, wid: int) -> int | None:
        return self.slots[wid].process.pid

    def _read(self, slot: _Slot) -> None:
        """Forward a worker's batches to the loop; report its death within ~0.1 s."""
        wid = slot.spec.worker_id
        while True:
            try:
                batch = slot.outbox.get(timeout=0.1)
            except queue.Empty:
                if not slot.process.is_alive():
                    if not self._stopping and self.slots.get(wid) is slot:
                        self.loop.call_soon_threadsafe(self.on_death, wid, slot.process.exitcode)
                    return
                continue
            except (EOFError, OSError):
                return
            if self.slots.get(wid) is slot:
                self.loop.call_soon_threadsafe(self.on_messages, wid, batch)

    def _kill(self, slot: _Slot) -> None:
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(timeout=5)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask every worker to exit, then join; kill what does not exit in time."""
        self._stopping = True
        for slot in self.slots.values():
            try:
                slot.inbox.put(Shutdown())
            except (OSError, ValueError):
                pass
        for slot in self.slots.values():
            slot.process.join(timeout=timeout_s)
            if slot.process.is_alive():
                log.warning("worker %d did not exit in %.0f s; killing it", slot.spec.worker_id, timeout_s)
                self._kill(slot)
