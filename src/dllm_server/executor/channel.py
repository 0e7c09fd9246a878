"""Front <-> worker channels: pipes for workers the front spawns, a TCP socket for the others. Either way the
worker reads an inbox (get / get_nowait) and puts batches to an outbox; the front's get raises EOFError once
the worker is gone."""
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
    """The worker's end of the pipe; the loop pickles and writes itself (no mp.Queue feeder thread and its
    GIL handoffs: docs/benchmarks.md §8). ForkingPickler: tensors travel as shared memory."""

    def __init__(self, conn):
        self.conn = conn

    def put(self, batch: list) -> None:
        self.conn.send_bytes(ForkingPickler.dumps(batch))


class Outbox:
    """The front's end; `writer` goes to the worker process, and the front closes its own copy once the worker
    runs, so the worker's death (even mid-message) ends the read."""

    def __init__(self, ctx):
        self._conn, w = ctx.Pipe(duplex=False)
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(w.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        self.writer = OutboxWriter(w)

    def close_writer(self) -> None:
        self.writer.conn.close()

    def get(self, timeout: float) -> list:
        """The next batch; queue.Empty after `timeout` s; EOFError / OSError once the worker is gone."""
        if not self._conn.poll(timeout):
            raise queue.Empty
        return ForkingPickler.loads(self._conn.recv_bytes())


# The socket transport: one duplex TCP connection per worker (multiprocessing.connection, HMAC-authenticated
# with a per-server key). Not ZMQ: a dead peer must end the reader's read, and ZMQ reconnects and queues silently.


def no_delay(conn) -> None:
    """TCP_NODELAY: a step's few hundred bytes go out at once, not held back for Nagle's rule."""
    with contextlib.suppress(OSError):
        s = socket.socket(fileno=os.dup(conn.fileno()))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.close()


class SocketHub:
    """The front's listening socket: every worker connects once and names itself. Each handshake runs in its
    own thread under HANDSHAKE_S, so a stranger that sends nothing never holds up the next worker."""

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
                continue
            threading.Thread(target=self._handshake, args=(sock,), name="dllm-socket-handshake",
                             daemon=True).start()

    def _handshake(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(os.dup(sock.fileno()))
        timer = threading.Timer(self.HANDSHAKE_S, _shutdown, (sock,))   # wakes a read that waits forever
        timer.start()
        try:
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
            key = conn.recv_bytes(256).decode()
        except (OSError, EOFError, ValueError, AuthenticationError):
            conn.close()
            return
        finally:
            timer.cancel()
            sock.close()
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
    """The worker's inbox, with mp.Queue's get / get_nowait. Plain pickle: no shared memory across nodes."""

    def __init__(self, conn):
        self.conn = conn

    def get(self, timeout: float | None = None):
        if not self.conn.poll(timeout):
            raise queue.Empty
        return pickle.loads(self.conn.recv_bytes())

    def get_nowait(self):
        return self.get(0.0)


class SocketOutbox:
    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def put(self, batch: list) -> None:
        data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:
            self.conn.send_bytes(data)


class SocketChannel:
    """The front's end of one worker's connection; until the worker connects, `get` waits and `send` holds."""

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
