"""A worker killed in the middle of writing a message to its outbox: the death is reported once,
after everything it sent whole, and no reader thread is left blocked on the rest of the message
(the front holds no write end of the pipe). Real processes and pipes; the child writes the first
bytes of a 1 MiB message by hand, which is where a SIGKILL during a large put leaves the pipe."""
import asyncio
import os
import signal
import struct
import time

import torch.multiprocessing as mp

from dllm_server.config import ServerConfig
from dllm_server.executor.launchers import PipeChannel, ProcessHandle
from dllm_server.executor.worker_pool import WorkerPool, _Slot
from dllm_server.messages import WorkerSpec


def _half_write_then_wait(outbox, ready) -> None:
    outbox.put(["a whole batch"])
    os.write(outbox.conn.fileno(), struct.pack("!i", 1 << 20) + b"x" * 4096)     # header + the first 4 KiB
    ready.set()
    time.sleep(600)


def _start(pool: WorkerPool, ctx, wid: int = 0) -> tuple[_Slot, object]:
    ready = ctx.Event()
    channel = PipeChannel(ctx)
    proc = ctx.Process(target=_half_write_then_wait, args=(channel.outbox.writer, ready), daemon=True)
    proc.start()
    channel.started()
    slot = _Slot(WorkerSpec(wid, "colocated", "cpu", 1, "-", 1, 0), ProcessHandle(proc), channel)
    pool.slots[wid] = slot
    pool._monitor(slot)
    return slot, ready


async def test_a_worker_killed_mid_message_is_reported_dead():
    loop = asyncio.get_running_loop()
    got, deaths = [], []
    died = asyncio.Event()

    def on_death(wid, code):
        deaths.append((wid, code))
        died.set()
    pool = WorkerPool(ServerConfig(), "-", ["colocated"], [("cpu",)], loop, lambda w, b: got.append(b), on_death)
    ctx = mp.get_context("spawn")
    slot, ready = _start(pool, ctx)
    assert await loop.run_in_executor(None, ready.wait, 60)
    await asyncio.sleep(0.3)                # the reader is now inside the partial message
    os.kill(slot.process.pid, signal.SIGKILL)
    t0 = time.monotonic()
    await asyncio.wait_for(died.wait(), 10)
    took = time.monotonic() - t0
    assert deaths == [(0, -signal.SIGKILL)] and got == [["a whole batch"]]
    assert took < 3, took
    await asyncio.sleep(0.5)
    assert not slot.reader.is_alive()       # the end of the pipe reached it, mid-message
    assert len(deaths) == 1                  # reported once


async def test_a_replaced_process_is_not_reported_as_a_new_death():
    """A restart kills the old process (every member of a process group): that death belongs to
    the restart, not to the pool's callbacks."""
    loop = asyncio.get_running_loop()
    deaths = []
    pool = WorkerPool(ServerConfig(), "-", ["colocated"], [("cpu",)], loop, lambda w, b: None,
                      lambda w, c: deaths.append(w))
    ctx = mp.get_context("spawn")
    old, ready = _start(pool, ctx)
    assert await loop.run_in_executor(None, ready.wait, 60)
    old.process.kill()                      # on the loop, then replaced at once, as restart() does
    new, ready2 = _start(pool, ctx)
    await asyncio.sleep(2.5)
    assert deaths == []
    new.process.kill()
    await asyncio.sleep(2.5)
    assert deaths == [0]
