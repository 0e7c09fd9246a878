"""A worker process as a Ray actor: worker_main under a long-running `run` call whose end signals its death.
Per-iteration messages use the socket channel, never Ray calls (too slow: docs/multinode.md)."""
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
        """(node IP, a free TCP port, pid): a torch.distributed rendezvous every node can reach."""
        import ray
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port, os.getpid()

    def run(self, spec: WorkerSpec, config: WorkerConfig, ends: SocketEnds | None) -> None:
        inbox, outbox = ends.connect() if ends is not None else (None, None)
        worker_main(spec, config, inbox, outbox)
