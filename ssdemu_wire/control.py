"""The control plane's wire format: one JSON object per SOCK_SEQPACKET message, file
descriptors (memfds, eventfds) riding along as SCM_RIGHTS.  Shared by the daemon and hostlib.
"""

from __future__ import annotations

import json
import socket

MAX_MESSAGE = 64 * 1024
MAX_FDS = 4
# a socket path's bytes: sun_path holds 108 with its terminating zero
MAX_SOCKET_PATH = 107


class ControlError(Exception):
    """The other side sent something that is not a control message."""


def send(sock: socket.socket, msg: dict, fds: list[int] = ()) -> None:
    data = json.dumps(msg).encode()
    if len(data) > MAX_MESSAGE:
        raise ControlError(f"control message too large ({len(data)} bytes)")
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def recv(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and its descriptors; (None, []) when the peer closed."""
    data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            _close(fd)
        return None, []
    try:
        msg = json.loads(data)
        if not isinstance(msg, dict):
            raise ValueError("not an object")
    except ValueError as e:
        for fd in fds:
            _close(fd)
        raise ControlError(f"bad control message: {e}") from None
    return msg, fds


def _close(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
