"""Worker processes: start (through a launch backend, executor/launchers.py: local subprocesses or
Ray actors), one channel per worker (executor/channel.py: pipes or a socket), a reader thread per channel
feeding the asyncio loop, liveness by process state (and by the launcher's own sign of a death,
independently of the channel), restart and join. Holds no policy: deaths and messages are handed
to callbacks on the loop.

A worker is a model *instance*: with tensor_parallel_size d it is d processes (rank 0 leads and
owns the inbox and outbox; the followers only run the sharded forwards its plans describe), in
a torch.distributed world of their own, so restarting one instance touches no other. Any rank's
death is its instance's: the others are killed at once (they would wait in a collective), and
the death is reported once, for the worker id.

With executor/launchers.py this is the front process's seam to the worker side: the only engine/ or
api/ modules that import from worker/ (the entries they start). Everything else crosses as
messages."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import queue
import threading
from dataclasses import dataclass, field

from ..config import ServerConfig
from ..messages import Shutdown, WorkerSpec
from .launchers import make_launcher

log = logging.getLogger(__name__)
# How long a dead worker's reader gets to hand over what the worker sent before dying, before the
# death is reported without it (the reader is stuck on a message the worker died writing).
READER_GRACE_S = 1.0


@dataclass(slots=True)
class _Slot:
    spec: WorkerSpec
    process: object                     # the leader's handle (launchers.py)
    channel: object                     # its inbox and outbox
    followers: list = field(default_factory=list)   # tensor-parallel ranks 1..d-1 (handles)
    reader: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    death_reported: bool = False        # by a thread (once)
    dead: bool = False                  # seen on the loop: later batches are dropped


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
        self.slots: dict[int, _Slot] = {}
        self.starts: dict[int, int] = {}    # processes started per worker id
        self._stopping = False
        # Leave a core to the front process: OpenMP threads that lose their core to it spin at
        # barriers, which on 2 cores made a 2-thread worker 15x slower (bench/http_vs_offline.py).
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.tp = config.tensor_parallel_size
        self.threads = config.threads_per_worker or max(1, (cores - 1) // (len(roles) * self.tp))
        self.launcher = make_launcher(config, len(roles), self.tp, self.threads, devices[0][0].startswith("cuda"))

    @property
    def uses_process_group(self) -> bool:
        return "prefill" in self.roles

    def start_all(self) -> None:
        self._start_group(list(range(len(self.roles))))

    def _start_group(self, ids: list[int]) -> None:
        """Start these workers; the ones that hand KV over share one torch.distributed world,
        whose store lives in worker 0's process (its node's address)."""
        handles = {wid: [self.launcher.create(wid, r) for r in range(len(self.devices[wid]))] for wid in ids}
        kv = self.launcher.rendezvous(handles[0][0]) if self.uses_process_group else ("127.0.0.1", 0)
        for wid in ids:
            self._start(wid, kv, handles[wid])

    def start_instance(self, wid: int) -> None:
        """A regroup's new instance in slot `wid`, on the devices the engine set for it in
        `devices[wid]` (its degree is their number; colocated placement; cluster/regroup.py)."""
        self._start(wid, ("127.0.0.1", 0), [self.launcher.create(wid, r) for r in range(len(self.devices[wid]))])

    def retire(self, wid: int, timeout_s: float = 30.0) -> None:
        """Stop one instance for good (a regroup): Shutdown, join, kill what lingers. Blocking;
        its end is no death (the slot is gone before the watcher reports)."""
        slot = self.slots.pop(wid)
        slot.dead = True
        with contextlib.suppress(OSError, ValueError):
            slot.channel.send(Shutdown())
        for p in [slot.process, *slot.followers]:
            p.join(timeout=timeout_s)
        self._kill(slot)
        slot.channel.close()

    def _start(self, wid: int, kv: tuple[str, int], handles: list) -> None:
        peer_role = {"prefill": "decode", "decode": "prefill"}.get(self.roles[wid])
        peers = tuple(i for i, r in enumerate(self.roles) if r == peer_role)
        tp = len(handles)
        tp_host, tp_port = self.launcher.rendezvous(handles[0]) if tp > 1 else ("127.0.0.1", 0)
        starts = self.starts.get(wid, 0)
        spec = WorkerSpec(wid, self.roles[wid], self.devices[wid][0], self.threads, self.model_path,
                          len(self.roles) if self.uses_process_group else 1, kv[1], peers, starts,
                          0, tp, tp_port, kv[0], tp_host)
        self.starts[wid] = starts + 1
        channel = self.launcher.channel(f"{wid}-{starts}")
        self.launcher.run(handles[0], spec, self.worker_config, channel)
        for rank in range(1, tp):
            follower = dataclasses.replace(spec, device=self.devices[wid][rank], tp_rank=rank)
            self.launcher.run(handles[rank], follower, self.worker_config, None)
        slot = _Slot(spec, handles[0], channel, handles[1:])
        self.slots[wid] = slot
        self._monitor(slot)

    def _monitor(self, slot: _Slot) -> None:
        wid = slot.spec.worker_id
        slot.reader = threading.Thread(target=self._read, args=(slot,), name=f"dllm-outbox-{wid}", daemon=True)
        slot.reader.start()
        threading.Thread(target=self._watch, args=(slot,), name=f"dllm-sentinel-{wid}", daemon=True).start()

    def restart(self, wid: int) -> list[int]:
        """Restart one worker, or all of them when they share a torch.distributed group (a
        group cannot re-admit a member). Returns the ids restarted."""
        ids = list(self.slots) if self.uses_process_group else [wid]
        for i in ids:
            self._kill(self.slots[i])
            self.slots[i].channel.close()
        self._start_group(ids)
        return ids

    def kill(self, wid: int) -> None:
        """SIGKILL one worker (a hung one), every rank of it; its outbox reader reports the death
        as for any other."""
        for p in [self.slots[wid].process, *self.slots[wid].followers]:
            p.kill()

    def pids(self, wid: int) -> list[int | None]:
        """Every rank's process id, the leader first (none for a slot with no instance)."""
        slot = self.slots.get(wid)
        return [p.pid for p in [slot.process, *slot.followers]] if slot is not None else []

    def send(self, wid: int, msg) -> None:
        self.slots[wid].channel.send(msg)

    def _read(self, slot: _Slot) -> None:
        """Forward a worker's batches to the loop; once it is dead and its outbox empty, report
        the death (after everything it sent, within ~0.1 s)."""
        _no_wakeup_preemption()
        while True:
            try:
                batch = slot.channel.get(timeout=0.1)
            except queue.Empty:
                if not slot.process.is_alive():
                    self._report_death(slot)
                    return
                continue
            except (EOFError, OSError):      # the worker is gone (or died mid-message): the watcher reports it
                return
            self._post(self._deliver, slot, batch)

    def _watch(self, slot: _Slot) -> None:
        """The death as the launcher reports it (a process sentinel, the end of an actor's run call),
        whatever the channel does (a reader stopped by a half-written message, or one that is slow
        to see the end of the pipe).
        The reader gets READER_GRACE_S to report the death in order, after everything the worker
        sent; if it has not, the death is reported here and whatever the reader still gets is
        dropped."""
        self.launcher.wait_any([slot.process, *slot.followers])
        for p in [slot.process, *slot.followers]:       # a rank alone cannot go on: the instance ends
            if p.is_alive():
                p.kill()
        slot.reader.join(READER_GRACE_S)
        if slot.reader.is_alive() and not self._stopping:
            log.error("worker %d died, its outbox reader is stuck (a message half-written?)", slot.spec.worker_id)
        self._report_death(slot)

    def _report_death(self, slot: _Slot) -> None:
        """From the reader or the watcher thread, whichever is first; once per process."""
        with slot.lock:
            if slot.death_reported:
                return
            slot.death_reported = True
        if not self._stopping:
            self._post(self._died, slot)

    def _post(self, fn, *args) -> None:
        with contextlib.suppress(RuntimeError):     # the loop is closed: nobody to tell
            self.loop.call_soon_threadsafe(fn, *args)

    # On the loop, where restarts happen: whether `slot` is still the worker's current process is
    # decided here, so a process killed by a restart is never reported as a new death.
    def _deliver(self, slot: _Slot, batch: list) -> None:
        if not slot.dead and self.slots.get(slot.spec.worker_id) is slot:
            self.on_messages(slot.spec.worker_id, batch)

    def _died(self, slot: _Slot) -> None:
        slot.dead = True
        if not self._stopping and self.slots.get(slot.spec.worker_id) is slot:
            self.on_death(slot.spec.worker_id, slot.process.exitcode)

    def _kill(self, slot: _Slot) -> None:
        for p in [slot.process, *slot.followers]:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask every worker to exit, then join; kill what does not exit in time."""
        self._stopping = True
        for slot in self.slots.values():
            try:
                slot.channel.send(Shutdown())
            except (OSError, ValueError):
                pass
        for slot in self.slots.values():
            for p in [slot.process, *slot.followers]:     # the leader stops its followers on the way out
                p.join(timeout=timeout_s)
            if any(p.is_alive() for p in [slot.process, *slot.followers]):
                log.warning("worker %d did not exit in %.0f s; killing it", slot.spec.worker_id, timeout_s)
                self._kill(slot)
            slot.channel.close()
        self.launcher.close()


def _no_wakeup_preemption() -> None:
    """SCHED_BATCH for the calling (reader) thread, Linux: a worker's write to its outbox wakes
    this thread, and a woken thread that preempts the writer on its core stalls the worker's loop
    (mean 180-380 us per 300-byte write here, 25-70 us without the preemption:
    docs/benchmarks.md §8). The reader still runs at once on an idle core."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
