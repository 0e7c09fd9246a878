"""Worker process entry: build model + KV pool + core, say WorkerReady, then pump the inbox,
run iterations and send each iteration's messages in one put. Policy lives in the core."""
from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..config import ServerConfig
from ..messages import (Abort, BlockDone, HandoffDone, HandoffKV, InstallKV, ReceiveKV, RequestFailed, Shutdown,
                        SubmitBlock, WorkerFailed, WorkerReady)
from ..model.loader import load_model
from .core import WorkerCore
from .kv_transfer import KVReceiver, KVSender, Waiter, connect_peers, sending_owner


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    worker_id: int
    role: str                 # "colocated" | "prefill" | "decode"
    device: str
    num_threads: int
    model_path: str
    world_size: int           # > 1: join a torch.distributed group for KV transfer
    dist_port: int
    kv_peers: tuple[int, ...] = ()   # workers this one sends KV to or receives KV from


def worker_main(spec: WorkerSpec, config: ServerConfig, inbox, outbox) -> None:
    # The front process owns our lifecycle (Shutdown message, then kill): a Ctrl-C or SIGTERM
    # sent to the whole process group must not kill workers under a draining server.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A spawned process starts with logging unconfigured, which drops INFO (the CUDA graph
    # capture summary) from the server's log; same format as the front's.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        _run(spec, config, inbox, outbox)
    except Exception:
        outbox.put([WorkerFailed(spec.worker_id, traceback.format_exc())])
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(spec: WorkerSpec, config: ServerConfig, inbox, outbox) -> None:
    torch.set_num_threads(spec.num_threads)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model, args, dtype = load_model(spec.model_path, config.dtype, device)
    core = WorkerCore(config, model, args, dtype, device, config.pages_per_worker)
    waiter = Waiter(device)
    if spec.world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"tcp://127.0.0.1:{spec.dist_port}",
                                rank=spec.worker_id, world_size=spec.world_size)
        connect_peers(spec.worker_id, list(spec.kv_peers), device)
        core.sender = KVSender(spec.worker_id, core.pool, waiter)
        core.emit = outbox.put
    outbox.put([WorkerReady(spec.worker_id, core.pool.num_pages, core.pool.page_size, args, os.getpid())])
    incoming = KVReceiver(core, waiter)
    iterations = 0
    parent = os.getppid()
    continuing = 0          # blocks that ended last iteration with more blocks to come
    while True:
        turn_start = time.perf_counter()
        idle = not core.has_work and not waiter.pending
        if idle and os.getppid() != parent:    # the front died without stopping us
            return
        msgs = _drain(inbox, timeout=0.05 if idle else (0.001 if not core.has_work else 0.0))
        if continuing:
            # Their re-prefills are routed by the front a round trip later; waiting that long (at
            # most reprefill_wait_ms) lets them join this iteration instead of the next one.
            msgs += _await_submits(inbox, continuing - sum(isinstance(m, SubmitBlock) for m in msgs),
                                   config.reprefill_wait_ms / 1000)
        out: list = []
        for m in msgs:
            if isinstance(m, SubmitBlock):
                out += core.submit(m)
            elif isinstance(m, Abort):
                core.abort(m)
                incoming.abort(m.request_id)
            elif isinstance(m, HandoffKV):
                if not core.send_held(m.request_id, m.dst_worker):   # never expected: only held blocks
                    out.append(RequestFailed(m.request_id, "handoff of a block this worker does not hold"))
            elif isinstance(m, ReceiveKV):
                incoming.post(m)
            elif isinstance(m, InstallKV):
                incoming.install(m.block)
            elif isinstance(m, Shutdown):
                return
        for t in waiter.completed():
            if t.error is not None:
                raise RuntimeError(f"KV transfer with worker {t.peer} failed: {t.error}")
            if t.is_sender:
                core.pool.free(sending_owner(t.request_id, t.block_index))
            else:
                incoming.received(t)
            out.append(HandoffDone(t.request_id, t.block_index, spec.worker_id, t.is_sender, t.ok, t.num_bytes,
                                   time.perf_counter() - t.started_at))
        continuing = 0
        if core.has_work:
            out += core.step()
            iterations += 1
            continuing = sum(isinstance(m, BlockDone) and not m.is_final for m in out)
        if out or msgs:
            # The turn's time covers inbox, step and building the batch; the put is the last act.
            out.append(core.load_report(spec.worker_id, iterations, time.perf_counter() - turn_start))
            outbox.put(out)


def _await_submits(inbox, expected: int, budget_s: float) -> list:
    msgs: list = []
    deadline = time.perf_counter() + budget_s
    while expected > 0:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        try:
            m = inbox.get(timeout=left)
        except queue.Empty:
            break
        msgs.append(m)
        expected -= isinstance(m, SubmitBlock)
    return msgs


def _drain(inbox, timeout: float) -> list:
    msgs = []
    try:
        msgs.append(inbox.get(timeout=timeout) if timeout > 0 else inbox.get_nowait())
        while True:
            msgs.append(inbox.get_nowait())
    except queue.Empty:
        pass
    return msgs
