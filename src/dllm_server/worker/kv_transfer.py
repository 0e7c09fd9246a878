"""Moving one request's KV between workers with torch.distributed point-to-point (gloo on CPU,
NCCL on GPU). The whole canvas's K and V for every layer travel as one contiguous tensor
[num_layers, 2, canvas_len, kv_heads, head_dim]. A transfer thread does the blocking calls, so
the worker loop never stalls. Allocating and freeing pages is the core's job."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .kv_pool import KVPool, PageAlloc


def _slots(alloc: PageAlloc, length: int) -> torch.Tensor | slice:
    if alloc.slot_ids is None:
        return slice(alloc.slot_base, alloc.slot_base + length)
    return alloc.slot_ids[:length]


def gather_kv(pool: KVPool, alloc: PageAlloc, length: int) -> torch.Tensor:
    idx = _slots(alloc, length)
    return torch.stack([torch.stack([layer.k[idx], layer.v[idx]]) for layer in pool.layers]).contiguous()


def scatter_kv(pool: KVPool, alloc: PageAlloc, data: torch.Tensor) -> None:
    idx = _slots(alloc, data.shape[2])
    for layer, kv in zip(pool.layers, data):
        layer.k[idx] = kv[0]
        layer.v[idx] = kv[1]


def kv_shape(pool: KVPool, length: int) -> tuple[int, ...]:
    k = pool.layers[0].k
    return (len(pool.layers), 2, length, k.shape[1], k.shape[2])


@dataclass(slots=True)
class Transfer:
    request_id: str
    buffer: torch.Tensor
    is_sender: bool
    ok: bool                    # receiver: pages were available (else the data is drained)
    peer: int
    tag: int
    started_at: float
    error: str | None = None


class TransferTable:
    """Runs transfers one at a time, in the order the engine issued them, on a background
    thread (gloo's async works only report completion through a blocking wait). A single global
    order over all transfers makes circular waits between workers impossible."""

    def __init__(self) -> None:
        self.pending: list[Transfer] = []
        self._jobs: queue.Queue[Transfer] = queue.Queue()
        self._done: queue.Queue[Transfer] = queue.Queue()
        threading.Thread(target=self._run, name="kv-transfer", daemon=True).start()

    def send(self, request_id: str, data: torch.Tensor, dst: int, tag: int) -> None:
        self._submit(Transfer(request_id, data, True, True, dst, tag, time.perf_counter()))

    def receive(self, request_id: str, shape, dtype, device, src: int, tag: int, ok: bool) -> None:
        buf = torch.empty(shape, dtype=dtype, device=device)
        self._submit(Transfer(request_id, buf, False, ok, src, tag, time.perf_counter()))

    def _submit(self, t: Transfer) -> None:
        self.pending.append(t)
        self._jobs.put(t)

    def _run(self) -> None:
        while True:
            t = self._jobs.get()
            try:
                if t.buffer.is_cuda:          # the current CUDA device is per thread
                    torch.cuda.set_device(t.buffer.device)
                if t.is_sender:
                    dist.send(t.buffer, dst=t.peer, tag=t.tag)
                else:
                    dist.recv(t.buffer, src=t.peer, tag=t.tag)
            except Exception as exc:   # surfaced by completed(); the worker then fails the block
                t.error = f"{type(exc).__name__}: {exc}"
            self._done.put(t)

    def completed(self) -> list[Transfer]:
        done = []
        while True:
            try:
                done.append(self._done.get_nowait())
            except queue.Empty:
                break
        self.pending = [t for t in self.pending if t not in done]
        return done
