"""A worker process as a Ray actor (`--distributed-executor-backend ray`): the same worker_main
loop, started by a long-running `run` call whose end is the front's sign of the actor's death.

Ray only places and starts the process; every per-iteration message goes over the socket
transport (executor/channel.py: a Ray call costs ~0.7-1.3 ms against ~0.13 ms for a socket here), and KV
and tensor-parallel traffic over torch.distributed, at an address of rank 0's node.
"""
from __future__ import annotations

import os
import socket

from .channel import SocketEnds
from ..config import WorkerConfig
from ..messages import WorkerSpec
from .worker_main import worker_main


class WorkerActor:
    """Wrapped by ray.remote at launch (executor/launchers.py), so this module needs no Ray."""

    def where(self) -> tuple[str, int, int]:
        """(this node's IP as Ray sees it, a free TCP port on it, the process id): a
        torch.distributed rendezvous that every node can reach, when this rank leads one."""
        import ray
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port, os.getpid()

    def run(self, spec: WorkerSpec, config: WorkerConfig, ends: SocketEnds | None) -> None:
        inbox, outbox = ends.connect() if ends is not None else (None, None)
        worker_main(spec, config, inbox, outbox)
