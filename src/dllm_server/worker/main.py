"""Worker process entry: build the core, say WorkerReady, then pump: take what the inbox holds and
take one turn with it (worker/turn.py: one dispatch per message, finished KV transfers, an
iteration when there is work), then send the turn's messages in one put. Policy lives in the core."""
from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist

from ..config import WorkerConfig
from ..messages import WorkerFailed, WorkerReady, WorkerSpec
from .build import build_core, startup_profile
from .kv_transfer import connect_peers
from .turn import take_turn


def worker_main(spec: WorkerSpec, config: WorkerConfig, inbox, outbox) -> None:
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


def _run(spec: WorkerSpec, config: WorkerConfig, inbox, outbox) -> None:
    torch.set_num_threads(spec.num_threads)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    transfers = spec.world_size > 1
    if transfers:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"tcp://127.0.0.1:{spec.dist_port}",
                                rank=spec.worker_id, world_size=spec.world_size)
        connect_peers(spec.worker_id, list(spec.kv_peers), device)
    core, info = build_core(config, spec.model_path, device, spec.worker_id, transfers, emit=outbox.put)
    profile = startup_profile(core, info)
    outbox.put([WorkerReady(spec.worker_id, core.pool.num_pages, core.pool.page_size, info, profile)])
    iterations = 0
    parent = os.getppid()
    while True:
        turn_start = time.perf_counter()
        idle = not core.has_work and not core.transfers_pending
        if idle and os.getppid() != parent:    # the front died without stopping us
            return
        msgs = _drain(inbox, timeout=0.05 if idle else (0.001 if not core.has_work else 0.0))
        # The turn's time covers inbox, step and building the batch; the put is the last act.
        turn = take_turn(core, msgs, spec.worker_id, iterations, lambda _: time.perf_counter() - turn_start)
        if turn is None:
            return
        out, iterations = turn
        if out:
            outbox.put(out)


def _drain(inbox, timeout: float) -> list:
    msgs = []
    try:
        msgs.append(inbox.get(timeout=timeout) if timeout > 0 else inbox.get_nowait())
        while True:
            msgs.append(inbox.get_nowait())
    except queue.Empty:
        pass
    return msgs
