"""The channels between the front and a worker: two transports behind one small interface (the
worker reads an inbox with get / get_nowait and puts batches to an outbox; the front sends to
the inbox and gets batches, EOFError once the worker is gone), chosen at construction.

Pipes (workers the front spawns itself, executor/worker_pool.py): the inbox is an mp.Queue, the
outbox a one-way pipe the worker's loop writes synchronously.

mp.Queue hands every put to a feeder thread in the writing process; at batch 1 the GIL handoffs
between a worker's loop and that thread (on the put's notify and on the next inbox poll) took
about 17 % of the worker's time (py-spy). With this pipe and the reader's SCHED_BATCH
(executor/worker_pool.py) the served path's extra cost per step fell from 0.75 to 0.49 ms
(docs/benchmarks.md §8).
Here the loop pickles (a few hundred bytes per step) and writes itself. Serialisation is
mp.Queue's (ForkingPickler: tensors travel as shared memory). The front closes its copy of the
write end once the worker runs, so a worker's death (even mid-message) ends the reader's read.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import queue
import secrets
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
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


# ---------------------------------------------------------------- the socket transport (other nodes)
#
# For workers the front did not spawn itself (Ray actors, maybe on other machines): one duplex TCP
# connection per worker, the stdlib's multiprocessing.connection (length-prefixed frames, an HMAC
# challenge with a per-server key, so only the server's own workers connect). Chosen over ZMQ
# because a dead peer must end the reader's read: a closed TCP connection raises EOFError at once,
# as the pipe does, while ZMQ reconnects and queues silently and would need a heartbeat protocol
# of its own. Plain pickle (tensors travel by value: there is no shared memory across nodes).



def no_delay(conn) -> None:
    """TCP_NODELAY: a step's few hundred bytes go out at once, not held back for Nagle's rule."""
    with contextlib.suppress(OSError):
        s = socket.socket(fileno=os.dup(conn.fileno()))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.close()


class SocketHub:
    """The front's listening socket: every worker connects once and names itself.

    Each connection's handshake (the HMAC challenge both ways, then the worker's key) runs in a
    thread of its own under HANDSHAKE_S: a stranger on the port that sends nothing, the wrong key
    or garbage is dropped and never holds up the next worker's connection."""

    HANDSHAKE_S = 10.0

    def __init__(self, host: str):
        self.authkey = secrets.token_bytes(32)
        self.listener = socket.create_server((host, 0), backlog=64)
        self.address = self.listener.getsockname()[:2]
        self._channels: dict[str, "SocketChannel"] = {}
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="dllm-socket-hub", daemon=True).start()

    def channel(self, key: str) -> "SocketChannel":
        ch = SocketChannel(SocketEnds(self.address, self.authkey, key))
        with self._lock:
            self._channels[key] = ch
        return ch

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                continue                 # closed (the loop ends), or a connection reset before accept
            threading.Thread(target=self._handshake, args=(sock,), name="dllm-socket-handshake",
                             daemon=True).start()

    def _handshake(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(os.dup(sock.fileno()))
        timer = threading.Timer(self.HANDSHAKE_S, _shutdown, (sock,))   # wakes a read that waits forever
        timer.start()
        try:
            deliver_challenge(conn, self.authkey)     # what Listener.accept does, here under a deadline
            answer_challenge(conn, self.authkey)
            key = conn.recv_bytes(256).decode()
        except (OSError, EOFError, ValueError, AuthenticationError):
            conn.close()                 # a stranger, a wrong key, a worker that died connecting
            return
        finally:
            timer.cancel()
            sock.close()                 # the duplicate; the connection keeps its own descriptor
        with self._lock:
            ch = self._channels.pop(key, None)
        if ch is None:
            conn.close()
        else:
            ch.attach(conn)

    def close(self) -> None:
        self._closed = True
        _shutdown(self.listener)
        with contextlib.suppress(OSError):
            self.listener.close()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class SocketEnds:
    """What a worker needs to reach the front (picklable: it travels in the actor call)."""

    def __init__(self, address: tuple[str, int], authkey: bytes, key: str):
        self.address, self.authkey, self.key = address, authkey, key

    def connect(self) -> tuple["SocketInbox", "SocketOutbox"]:
        conn = Client(self.address, family="AF_INET", authkey=self.authkey)
        no_delay(conn)
        conn.send_bytes(self.key.encode())
        return SocketInbox(conn), SocketOutbox(conn)


class SocketInbox:
    """The worker's inbox: mp.Queue's get / get_nowait (queue.Empty when nothing waits)."""

    def __init__(self, conn):
        self.conn = conn

    def get(self, timeout: float | None = None):
        if not self.conn.poll(timeout):
            raise queue.Empty
        return pickle.loads(self.conn.recv_bytes())

    def get_nowait(self):
        return self.get(0.0)


class SocketOutbox:
    """The worker's outbox: one frame per batch."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def put(self, batch: list) -> None:
        data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:
            self.conn.send_bytes(data)


class SocketChannel:
    """The front's end of one worker's connection: `send` a message to its inbox, `get` its next
    batch (queue.Empty after `timeout`; EOFError once it is gone). Until the worker has connected
    (its process starting), `get` waits and `send` holds the messages."""

    def __init__(self, ends: SocketEnds):
        self.ends = ends
        self._conn = None
        self._connected = threading.Event()
        self._lock = threading.Lock()
        self._held: list = []

    def attach(self, conn) -> None:
        with self._lock:
            self._conn = conn
            for msg in self._held:
                conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
            self._held.clear()
        self._connected.set()

    def send(self, msg) -> None:
        with self._lock:
            if self._conn is None:
                self._held.append(msg)
                return
            self._conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))

    def get(self, timeout: float) -> list:
        if not self._connected.wait(timeout):
            raise queue.Empty
        if not self._conn.poll(timeout):
            raise queue.Empty
        return pickle.loads(self._conn.recv_bytes())

    def close(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self._conn.close()
