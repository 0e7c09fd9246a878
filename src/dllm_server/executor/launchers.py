"""Launch backends (`--distributed-executor-backend`): local subprocesses (mp) or Ray actors (ray). A launcher
only creates, places and watches processes; channels, deaths and restarts are WorkerPool's."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from multiprocessing.connection import wait

import torch.multiprocessing as mp

from .channel import Outbox, SocketHub
from ..server_process import free_port
from .worker_main import worker_main

log = logging.getLogger(__name__)
PLACEMENT_TIMEOUT_S = 120.0


class PipeChannel:
    """The front's end of a local worker's pipes (an mp.Queue inbox, a pipe outbox)."""

    def __init__(self, ctx):
        self.inbox, self.outbox = ctx.Queue(), Outbox(ctx)

    @property
    def ends(self):
        return self.inbox, self.outbox.writer

    def started(self) -> None:
        self.outbox.close_writer()

    def send(self, msg) -> None:
        self.inbox.put(msg)

    def get(self, timeout: float) -> list:
        return self.outbox.get(timeout)

    def close(self) -> None:
        pass


class ProcessHandle:
    def __init__(self, proc):
        self.proc = proc

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def exitcode(self) -> int | None:
        return self.proc.exitcode

    def is_alive(self) -> bool:
        return self.proc.is_alive()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()

    def join(self, timeout: float) -> None:
        self.proc.join(timeout=timeout)


class MpLauncher:
    name = "mp"

    def __init__(self):
        self.ctx = mp.get_context("spawn")

    def channel(self, key: str) -> PipeChannel:
        return PipeChannel(self.ctx)

    def create(self, wid: int, rank: int) -> ProcessHandle:
        return ProcessHandle(None)

    def rendezvous(self, handle: ProcessHandle) -> tuple[str, int]:
        return "127.0.0.1", free_port()

    def run(self, handle: ProcessHandle, spec, config, channel: PipeChannel | None) -> None:
        name = f"dllm-worker-{spec.worker_id}" + (f"-rank{spec.tp_rank}" if spec.tp_rank else "")
        ends = channel.ends if channel is not None else (None, None)
        spec = dataclasses.replace(spec, parent_pid=os.getpid())
        handle.proc = self.ctx.Process(target=worker_main, args=(spec, config, *ends), name=name, daemon=True)
        handle.proc.start()
        if channel is not None:
            channel.started()

    def wait_any(self, handles: list[ProcessHandle]) -> None:
        wait([h.proc.sentinel for h in handles])

    def close(self) -> None:
        pass


class RayHandle:
    def __init__(self, actor, pid: int, node_ip: str, port: int):
        self.actor, self.pid, self.node_ip, self.port = actor, pid, node_ip, port
        self.ref = None              # the long-running run() call: it ends when the process does
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        import ray
        if self.ref is None:
            return True
        try:
            done, _ = ray.wait([self.ref], timeout=0)
        except Exception:              # no Ray connection: nothing of ours runs
            return False
        return not done

    def kill(self) -> None:
        import ray
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)

    def join(self, timeout: float) -> None:
        import ray
        if self.ref is not None:
            ray.wait([self.ref], timeout=timeout)


class RayLauncher:
    """Workers as Ray actors, one bundle per process. With tensor parallelism each instance gets its own
    STRICT_PACK group, so its all-reduces never cross nodes."""
    name = "ray"

    def __init__(self, config, degrees: list[int], num_threads: int, use_gpu: bool):
        try:
            import ray
            from ray.util.placement_group import placement_group
        except ImportError:
            raise ValueError("distributed_executor_backend: ray needs Ray: pip install 'dllm-server[ray]'") from None
        self.ray = ray
        self.groups: list = []
        self.hub: SocketHub | None = None
        address = None if config.ray_address in (None, "local") else config.ray_address
        ray.init(address=address, namespace=config.ray_namespace, ignore_reinit_error=True,
                 **({} if address is not None else {"num_cpus": os.cpu_count()}))
        self.hub = SocketHub(ray.util.get_node_ip_address())
        bundle = {"CPU": num_threads, **({"GPU": 1} if use_gpu else {})}
        if max(degrees) == 1:
            groups = [placement_group([bundle] * len(degrees), strategy=config.ray_placement_strategy)]
            self.bundles = {(w, 0): (groups[0], w) for w in range(len(degrees))}
        else:
            groups = [placement_group([bundle] * d, strategy="STRICT_PACK") for d in degrees]
            self.bundles = {(w, r): (groups[w], r) for w, d in enumerate(degrees) for r in range(d)}
        self.groups = groups
        try:
            ray.get([g.ready() for g in groups], timeout=PLACEMENT_TIMEOUT_S)
        except Exception:
            self.close()
            raise RuntimeError(f"ray: the placement groups ({len(groups)} x {bundle}) were not placed within "
                               f"{PLACEMENT_TIMEOUT_S:.0f} s; see `ray status` for the cluster's free resources") from None
        from .ray_actor import WorkerActor
        self.actor_cls = ray.remote(WorkerActor)
        self.num_threads, self.use_gpu = num_threads, use_gpu

    def channel(self, key: str):
        return self.hub.channel(key)

    def create(self, wid: int, rank: int) -> RayHandle:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        group, index = self.bundles[(wid, rank)]
        actor = self.actor_cls.options(
            num_cpus=self.num_threads, num_gpus=1 if self.use_gpu else 0, name=None, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)).remote()
        node_ip, port, pid = self.ray.get(actor.where.remote(), timeout=PLACEMENT_TIMEOUT_S)
        return RayHandle(actor, pid, node_ip, port)

    def rendezvous(self, handle: RayHandle) -> tuple[str, int]:
        """Rank 0's node IP, not 127.0.0.1: every node must reach the store."""
        return handle.node_ip, handle.port

    def run(self, handle: RayHandle, spec, config, channel) -> None:
        handle.ref = handle.actor.run.remote(spec, config, channel.ends if channel is not None else None)

    def wait_any(self, handles: list[RayHandle]) -> None:
        refs = [h.ref for h in handles if h.ref is not None]
        try:
            if refs:
                self.ray.wait(refs, num_returns=1)
        except Exception:              # Ray itself went away: as good as every actor dying
            for h in handles:
                h.exitcode = 1 if h.exitcode is None else h.exitcode
            return
        for h in handles:
            if h.ref is not None and not h.is_alive():
                with contextlib.suppress(Exception):
                    self.ray.get(h.ref, timeout=0)
                    h.exitcode = 0
                if h.exitcode is None:
                    h.exitcode = 1

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group
        for g in self.groups:
            with contextlib.suppress(Exception):
                remove_placement_group(g)
        if self.hub is not None:
            self.hub.close()
        with contextlib.suppress(Exception):
            self.ray.shutdown()


def make_launcher(config, degrees: list[int], num_threads: int, use_gpu: bool):
    """`degrees`: every instance's TP degree, in worker order."""
    if config.distributed_executor_backend == "ray":
        return RayLauncher(config, degrees, num_threads, use_gpu)
    return MpLauncher()
