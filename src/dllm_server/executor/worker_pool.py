"""Worker processes: start, one channel and reader thread each, liveness, restart and join; no policy (messages
and deaths go to callbacks on the loop). A worker is an instance of tp processes; any rank's death is the
instance's, reported once."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..config import ServerConfig, TestHooks
from ..messages import Shutdown, WorkerSpec
from ..worker.kv_shards import world_ranks
from .launchers import make_launcher

log = logging.getLogger(__name__)
READER_GRACE_S = 1.0    # for a dead worker's reader to deliver its last batches (it may be stuck mid-message)


@dataclass(slots=True)
class _Slot:
    spec: WorkerSpec
    process: object                     # the leader's handle
    channel: object
    followers: list = field(default_factory=list)
    reader: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    death_reported: bool = False
    dead: bool = False                  # seen on the loop: later batches are dropped
    send_failed: bool = False


class WorkerPool:
    def __init__(self, config: ServerConfig, model_path: str, roles: list[str], devices: list[str],
                 loop: asyncio.AbstractEventLoop, on_messages, on_death, hooks: TestHooks | None = None):
        self.config = config
        self.worker_config = config.worker_config(hooks)
        self.model_path = model_path
        self.roles = roles
        self.devices = devices
        self.loop = loop
        self.on_messages = on_messages      # (worker_id, list[msg]) on the loop
        self.on_death = on_death            # (worker_id, exitcode) on the loop
        self.slots: dict[int, _Slot] = {}
        self.starts: dict[int, int] = {}
        self._stopping = False
        self._slots_lock = threading.RLock()     # restarts run off the loop: stop and regroups wait for them
        # Restarts and a regroup's new instances are spawned off the loop, from one thread as long-lived as the
        # pool: a worker's PR_SET_PDEATHSIG fires when the thread that spawned it exits.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dllm-spawn")
        # Leave a core to the front: OpenMP threads that lose their core spin at barriers (docs/benchmarks.md §3).
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        degrees = [len(d) for d in devices]
        self.threads = config.threads_per_worker or max(1, (cores - 1) // sum(degrees))
        self.launcher = make_launcher(config, degrees, self.threads, devices[0][0].startswith("cuda"))
        self.kv_ranks = world_ranks(degrees)

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def uses_process_group(self) -> bool:
        return "prefill" in self.roles

    def start_all(self) -> None:
        self._start_group(list(range(len(self.roles))))

    def _start_group(self, ids: list[int]) -> None:
        """The workers that hand KV over share one torch.distributed world, its store in worker 0's process."""
        handles = {wid: [self.launcher.create(wid, r) for r in range(len(self.devices[wid]))] for wid in ids}
        kv = self.launcher.rendezvous(handles[0][0]) if self.uses_process_group else ("127.0.0.1", 0)
        for wid in ids:
            self._start(wid, kv, handles[wid])

    def start_instance(self, wid: int) -> None:
        """A regroup's new instance in slot `wid`, on `devices[wid]` (its degree is their number)."""
        with self._slots_lock:
            if not self._stopping:
                handles = [self.launcher.create(wid, r) for r in range(len(self.devices[wid]))]
                self._start(wid, ("127.0.0.1", 0), handles)

    def retire(self, wid: int, timeout_s: float = 30.0) -> None:
        """Stop one instance for good (a regroup); blocking. Not reported as a death: the slot is gone first."""
        with self._slots_lock:
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
        shared = self.uses_process_group      # its TP group lives in the KV world (worker_main._join)
        tp_host, tp_port = self.launcher.rendezvous(handles[0]) if tp > 1 and not shared else ("127.0.0.1", 0)
        starts = self.starts.get(wid, 0)
        spec = WorkerSpec(wid, self.roles[wid], self.devices[wid][0], self.threads, self.model_path,
                          sum(map(len, self.kv_ranks)) if shared else 1, kv[1], peers, starts,
                          0, tp, tp_port, kv[0], tp_host, kv_ranks=self.kv_ranks if shared else ())
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

    def restart_ids(self, wid: int) -> list[int]:
        """One worker, or all when they share a torch.distributed group (it cannot re-admit a member)."""
        return list(self.slots) if self.uses_process_group else [wid]

    def detach(self, ids: list[int]) -> None:
        """On the loop, before their requests are resumed: nothing more from these instances is delivered (a live
        member of a restarting group must not report a block the front has already taken back), their deaths are
        no new deaths, messages to them are dropped."""
        for i in ids:
            if i in self.slots:
                self.slots[i].dead = True

    def in_spawner(self, fn, *args) -> asyncio.Future:
        return self.loop.run_in_executor(self._spawner, fn, *args)

    def restart(self, wid: int) -> list[int]:
        """Restart restart_ids(wid), detach()ed first on the loop; returns them. Blocking (it joins the old
        processes and waits for new ones to be placed, seconds under Ray): run it in_spawner."""
        with self._slots_lock:
            ids = [i for i in self.restart_ids(wid) if i in self.slots]       # a regroup may have retired it
            for i in ids:
                self._kill(self.slots[i])
                self.slots[i].channel.close()
            if self._stopping:
                return []
            self._start_group(ids)
        return ids

    def kill(self, wid: int) -> None:
        """SIGKILL every rank of one (hung) worker; the death is reported as any other."""
        for p in [self.slots[wid].process, *self.slots[wid].followers]:
            p.kill()

    def pids(self, wid: int) -> list[int | None]:
        """Every rank's pid, the leader first."""
        slot = self.slots.get(wid)
        return [p.pid for p in [slot.process, *slot.followers]] if slot is not None else []

    def send(self, wid: int, msg) -> None:
        slot = self.slots[wid]
        if slot.dead:                        # being replaced: the new instance starts afresh
            return
        try:
            slot.channel.send(msg)
        except (OSError, ValueError) as exc:
            # its end is gone (a lost Ray node: the pipe breaks before the death is seen); raising here would cut
            # the scheduler's turn in half. Killed, so that its death report comes and resumes what was sent to it.
            if not slot.send_failed:
                slot.send_failed = True
                log.warning("worker %d: a send failed (%s: %s); killing it", wid, type(exc).__name__, exc)
                self.kill(wid)

    def _read(self, slot: _Slot) -> None:
        _no_wakeup_preemption()
        while True:
            try:
                batch = slot.channel.get(timeout=0.1)
            except queue.Empty:
                if not slot.process.is_alive():
                    self._report_death(slot)
                    return
                continue
            except (EOFError, OSError):      # the worker is gone: the watcher reports it
                return
            self._post(self._deliver, slot, batch)

    def _watch(self, slot: _Slot) -> None:
        """The death as the launcher sees it, whatever the channel does (a reader may hang on a half-written
        message). The reader gets READER_GRACE_S to report it in order after the worker's last batches."""
        self.launcher.wait_any([slot.process, *slot.followers])
        for p in [slot.process, *slot.followers]:       # the other ranks would wait in a collective
            if p.is_alive():
                p.kill()
        slot.reader.join(READER_GRACE_S)
        if slot.reader.is_alive() and not self._stopping:
            log.error("worker %d died, its outbox reader is stuck (a message half-written?)", slot.spec.worker_id)
        self._report_death(slot)

    def _report_death(self, slot: _Slot) -> None:
        with slot.lock:
            if slot.death_reported:
                return
            slot.death_reported = True
        if not self._stopping:
            self._post(self._died, slot)

    def _post(self, fn, *args) -> None:
        with contextlib.suppress(RuntimeError):     # the loop is closed
            self.loop.call_soon_threadsafe(fn, *args)

    # Checked on the loop, where restarts happen, so a process killed by a restart is never a new death.
    def _deliver(self, slot: _Slot, batch: list) -> None:
        if not slot.dead and self.slots.get(slot.spec.worker_id) is slot:
            self.on_messages(slot.spec.worker_id, batch)

    def _died(self, slot: _Slot) -> None:
        if slot.dead:                        # replaced by a restart or retired: not a new death
            return
        slot.dead = True
        if not self._stopping and self.slots.get(slot.spec.worker_id) is slot:
            self.on_death(slot.spec.worker_id, slot.process.exitcode)

    def _kill(self, slot: _Slot) -> None:
        for p in [slot.process, *slot.followers]:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        with self._slots_lock:
            self._stop(timeout_s)
        self._spawner.shutdown(wait=False, cancel_futures=True)     # after the workers it spawned have stopped

    def _stop(self, timeout_s: float) -> None:
        for slot in self.slots.values():
            try:
                slot.channel.send(Shutdown())
            except (OSError, ValueError):
                pass
        for slot in self.slots.values():
            for p in [slot.process, *slot.followers]:
                p.join(timeout=timeout_s)
            if any(p.is_alive() for p in [slot.process, *slot.followers]):
                log.warning("worker %d did not exit in %.0f s; killing it", slot.spec.worker_id, timeout_s)
                self._kill(slot)
            slot.channel.close()
        self.launcher.close()


def _no_wakeup_preemption() -> None:
    """SCHED_BATCH for this reader thread (Linux): woken by a write, it must not preempt the writing worker on
    its core (docs/benchmarks.md §8)."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
