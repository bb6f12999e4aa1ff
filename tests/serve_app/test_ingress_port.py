"""What `epp up` says when the gateway port is taken: a live listener is named by pid; a port held
only by TIME_WAIT connections of a listener that did not set SO_REUSEADDR is called that (it used
to read "by a process this user can not see")."""

from __future__ import annotations

import os
import socket
import time

import pytest

from serve_app.ingress import PortInUse, check_port_free, reuseport_socket


def time_wait_port() -> int:
    """A port whose only trace is a server-side connection in TIME_WAIT (the server closed first)
    of a listener bound without SO_REUSEADDR, as Serve's direct ingress binds."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the active close: this side goes to TIME_WAIT
    time.sleep(0.05)
    client.close()
    listener.close()
    return port


def test_a_port_held_only_by_time_wait_connections_says_so():
    port = time_wait_port()
    for bind in (check_port_free, reuseport_socket):
        with pytest.raises(PortInUse) as err:
            bind("127.0.0.1", port)
        message = str(err.value)
        assert "TIME_WAIT" in message and "SO_REUSEADDR" in message and "no process holds it" in message, message
        assert "can not see" not in message
        assert err.value.time_wait >= 1


def test_a_live_listener_is_named_by_its_pid():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(PortInUse, match=f"pid {os.getpid()}"):
            check_port_free("127.0.0.1", port)
