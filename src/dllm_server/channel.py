"""The worker -> front channel: a one-way pipe the worker's loop writes synchronously.

mp.Queue hands every put to a feeder thread in the writing process; at batch 1 the GIL handoffs
between a worker's loop and that thread (on the put's notify and on the next inbox poll) took
about 17 % of the worker's time (py-spy). With this pipe and the reader's SCHED_BATCH
(engine/worker_pool.py) the served path's extra cost per step fell from 0.75 to 0.49 ms
(docs/benchmarks.md §8).
Here the loop pickles (a few hundred bytes per step) and writes itself. Serialisation is
mp.Queue's (ForkingPickler: tensors travel as shared memory). The front closes its copy of the
write end once the worker runs, so a worker's death (even mid-message) ends the reader's read.
"""
from __future__ import annotations

import contextlib
import fcntl
import queue
from multiprocessing.reduction import ForkingPickler

F_SETPIPE_SZ = 1031          # Linux: a 1 MiB pipe buffer lets the worker run ahead of a busy reader
PIPE_BYTES = 1 << 20


class OutboxWriter:
    """The worker's end (picklable: it travels to the spawned process)."""

    def __init__(self, conn):
        self.conn = conn

    def put(self, batch: list) -> None:
        self.conn.send_bytes(ForkingPickler.dumps(batch))


class Outbox:
    """The front's end; `writer` goes to the worker process."""

    def __init__(self, ctx):
        self._conn, w = ctx.Pipe(duplex=False)
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(w.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        self.writer = OutboxWriter(w)

    def close_writer(self) -> None:
        """Once the worker holds its own copy (after Process.start)."""
        self.writer.conn.close()

    def get(self, timeout: float) -> list:
        """The next batch; queue.Empty after `timeout` s; EOFError / OSError once the worker is gone."""
        if not self._conn.poll(timeout):
            raise queue.Empty
        return ForkingPickler.loads(self._conn.recv_bytes())
