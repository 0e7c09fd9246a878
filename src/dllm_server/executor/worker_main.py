"""Worker process entry: build the core, send WorkerReady, then pump inbox -> one turn -> one outbox put.
A tensor-parallel follower (rank > 0) has no inbox or outbox: it runs its leader's plans (worker/tp.py)."""
from __future__ import annotations

import dataclasses
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
from ..worker.build import build_core, build_stepper, startup_profile
from ..worker.determinism import check_model, summary as invariance_summary
from ..worker.kv_shards import KVWorld
from ..worker.kv_transfer import connect_peers
from ..worker.memory import IdleTrim, bound_kernel_caches, hold_freed_memory
from ..worker.runner import InstanceBroken
from ..worker.tp import TPGroups, follow, gather_rss, init_groups, subgroups
from ..worker.tp_handoff import FollowerHandoffs
from ..worker.turn import take_turn

log = logging.getLogger("dllm_server.worker")
HEARTBEAT_S = 1.0     # a worker with work reports at least this often, progress or not


def worker_main(spec: WorkerSpec, config: WorkerConfig, inbox, outbox) -> None:
    # The front process owns our lifecycle (Shutdown message, then kill): a Ctrl-C or SIGTERM
    # sent to the whole process group must not kill workers under a draining server.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = _die_with_parent(spec.parent_pid)
    # A spawned process starts with logging unconfigured, which would drop INFO lines.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if spec.tp_rank > 0:
            _follow(spec, config)
        else:
            _run(spec, config, inbox, outbox, parent)
    except (Exception, InstanceBroken):
        log.error("worker %d rank %d failed:\n%s", spec.worker_id, spec.tp_rank, traceback.format_exc())
        if outbox is not None:
            outbox.put([WorkerFailed(spec.worker_id, traceback.format_exc())])
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _die_with_parent(spawned_by: int = 0) -> int:
    """SIGKILL us when the front dies (Linux), even mid-forward: a killed front must not leave a worker
    holding a device. Returns the parent's pid, which the pump checks every turn (other platforms).
    `spawned_by`: the front's pid when it started us, so a front that died before we ran is seen too."""
    parent = spawned_by or os.getppid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:       # it died before the request took effect
        os._exit(1)
    return parent


def _prepare_device(spec: WorkerSpec, config: WorkerConfig) -> torch.device:
    torch.set_num_threads(spec.num_threads)
    device = torch.device(spec.device)
    if device.type == "cpu":
        bound_kernel_caches(config.cpu_kernel_cache_entries)
        hold_freed_memory(config.malloc_hold_mb)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _run(spec: WorkerSpec, config: WorkerConfig, inbox, outbox, parent: int) -> None:
    if spec.restarts and config.hooks.hang_at_forward:     # the injected hang is a one-off: a restart recovers
        config = dataclasses.replace(config, hooks=dataclasses.replace(config.hooks, hang_at_forward=0))
    device = _prepare_device(spec, config)
    tp = _join(spec, device)
    kv_ranks = spec.kv_ranks if spec.world_size > 1 else None
    core, info = build_core(config, spec.model_path, device, spec.worker_id, kv_ranks, emit=outbox.put, tp=tp)
    rss, weights = gather_rss(tp, core.stepper.weights_rss_mb)
    log.info("worker %d: %d rank(s), resident memory after loading %s MB (weights %s MB)", spec.worker_id,
             spec.tp_size, " / ".join(f"{r:.0f}" for r in rss), " / ".join(f"{r:.0f}" for r in weights))
    invariance = check_model(core.stepper.runner.model, config.block_length, config.policy.max_active_decodes)
    log.info("worker %d: %s", spec.worker_id, invariance_summary(invariance))
    try:
        profile = startup_profile(core, info)
        outbox.put([WorkerReady(spec.worker_id, core.pool.num_pages, core.pool.page_size, info, profile, invariance,
                                spec.tp_size, rss, weights)])
        _pump(spec, config, core, inbox, outbox, parent)
    finally:
        if tp is not None:
            core.stepper.runner.plan_sink.stop()        # the followers' loops end with ours


def _join(spec: WorkerSpec, device: torch.device) -> TPGroups | None:
    """Workers that hand KV over share one torch.distributed world of all their ranks (its store in worker 0's
    leader), and TP instances take their groups inside it; a TP instance alone has a world of its own."""
    if spec.world_size == 1:
        return init_groups(spec.tp_rank, spec.tp_size, spec.tp_host, spec.tp_port, device) if spec.tp_size > 1 \
            else None
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://{spec.dist_host}:{spec.dist_port}",
                            rank=spec.kv_ranks[spec.worker_id][spec.tp_rank], world_size=spec.world_size)
    tp = subgroups(spec.kv_ranks, spec.worker_id, spec.tp_rank, device)
    connect_peers(spec.kv_ranks[spec.worker_id][spec.tp_rank],          # every rank of every peer: both ends agree
                  [r for w in spec.kv_peers for r in spec.kv_ranks[w]], device)
    return tp


def _follow(spec: WorkerSpec, config: WorkerConfig) -> None:
    device = _prepare_device(spec, config)
    tp = _join(spec, device)
    stepper, pool, args = build_stepper(config, spec.model_path, device, tp)
    gather_rss(tp, stepper.weights_rss_mb)
    handoffs = FollowerHandoffs(KVWorld(spec.kv_ranks, args.num_kv_heads), spec.worker_id, spec.tp_rank, pool.layers,
                                device) if spec.world_size > 1 else None
    n = follow(stepper.runner, tp, args.mask_id, pool.page_size, handoffs)
    log.info("worker %d rank %d: stopped after %d forwards", spec.worker_id, spec.tp_rank, n)


def _pump(spec: WorkerSpec, config: WorkerConfig, core, inbox, outbox, parent: int) -> None:
    iterations = handled = 0
    trim = IdleTrim(config.malloc_trim_s)
    last_put = time.perf_counter()
    while True:
        turn_start = time.perf_counter()
        if os.getppid() != parent:
            return
        idle = not core.has_work and not core.transfers_pending
        trim.turn(busy=not idle)
        msgs = _drain(inbox, timeout=0.05 if idle else (0.001 if not core.has_work else 0.0))
        handled += len(msgs)
        # Every turn that took a message reports, and a worker with work at least every HEARTBEAT_S:
        # the front's watchdog counts on both.
        turn = take_turn(core, msgs, spec.worker_id, iterations, lambda _: time.perf_counter() - turn_start,
                         handled, heartbeat=turn_start - last_put > HEARTBEAT_S)
        if turn is None:
            return
        out, iterations = turn
        if out:
            outbox.put(out)
            last_put = time.perf_counter()


def _drain(inbox, timeout: float) -> list:
    msgs = []
    try:
        msgs.append(inbox.get(timeout=timeout) if timeout > 0 else inbox.get_nowait())
        while True:
            msgs.append(inbox.get_nowait())
    except queue.Empty:
        pass
    return msgs
