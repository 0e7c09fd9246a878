"""The socket transport (executor/channel.py) on loopback: strangers on the hub's port never hold up a
worker's connection, messages flow both ways, and a dead peer ends the reader's read."""
from __future__ import annotations

import queue
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from dllm_server.executor.channel import SocketHub


@pytest.fixture
def hub():
    h = SocketHub("127.0.0.1")
    yield h
    h.close()


def connect_in_thread(ends, box: list) -> threading.Thread:
    t = threading.Thread(target=lambda: box.append(ends.connect()), daemon=True)
    t.start()
    return t


def test_strangers_do_not_block_a_worker_and_messages_flow(hub):
    ch = hub.channel("w0")
    ch.send("held until the worker connects")
    silent = socket.create_connection(hub.address)          # connects, then says nothing
    garbage = socket.create_connection(hub.address)
    garbage.sendall(b"\x00\x00\x00\x05hello" * 4)
    with pytest.raises(AuthenticationError):
        Client(hub.address, family="AF_INET", authkey=b"not the key")
    box: list = []
    connect_in_thread(ch.ends, box).join(5)
    assert box, "the worker did not connect while a silent stranger held a connection open"
    inbox, outbox = box[0]
    assert inbox.get(timeout=5) == "held until the worker connects"
    ch.send({"step": 1})
    assert inbox.get(timeout=5) == {"step": 1}
    outbox.put([("delta", 3)])
    assert ch.get(timeout=5) == [("delta", 3)]
    with pytest.raises(queue.Empty):
        ch.get(timeout=0.05)
    outbox.conn.close()                                     # the worker dies
    with pytest.raises((EOFError, OSError)):
        ch.get(timeout=5)
    silent.close()
    garbage.close()


def test_a_silent_stranger_is_dropped_after_the_handshake_deadline(hub, monkeypatch):
    monkeypatch.setattr(SocketHub, "HANDSHAKE_S", 0.3)
    silent = socket.create_connection(hub.address)
    silent.settimeout(5)
    silent.recv(1024)                                       # the hub's challenge
    assert silent.recv(1024) == b"", "the hub kept a connection that never answered"
    silent.close()


def test_an_unknown_key_is_closed(hub):
    hub.channel("w0")
    conn = Client(hub.address, family="AF_INET", authkey=hub.authkey)
    conn.send_bytes(b"nobody")
    assert conn.poll(5)
    with pytest.raises(EOFError):
        conn.recv_bytes()
