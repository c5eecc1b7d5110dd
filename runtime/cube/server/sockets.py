"""Socket helpers of the cube server's data plane: a bounded ``sendall`` for non-blocking
sockets, and the two checks a stopping server makes before closing a connection (bytes
unread from the client, reply bytes not yet acknowledged by it)."""
from __future__ import annotations

import fcntl
import select
import socket
import struct
import termios


def send_nonblocking(sock: socket.socket, data, timeout_s: float = 10.0) -> None:
    """``sendall`` for a non-blocking socket: waits while the send buffer is full, at most
    ``timeout_s`` s at a time. ``data``: a bytes-like object. Raises ``TimeoutError`` when
    the client reads nothing for ``timeout_s`` s, ``OSError`` when the connection fails."""
    mv = memoryview(data)
    while mv:
        try:
            n = sock.send(mv)
            mv = mv[n:]
        except BlockingIOError:
            if not select.select([], [sock], [], timeout_s)[1]:
                raise TimeoutError("client not reading its replies")


def has_unread(sock: socket.socket) -> bool:
    """True when bytes sent by the client wait unread in ``sock`` (False at EOF or error)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return False


_TIOCOUTQ = getattr(termios, "TIOCOUTQ", None)  # Linux: SIOCOUTQ, bytes not yet acknowledged


def unacked(sock: socket.socket) -> int:
    """Bytes of replies in ``sock``'s send queue the client has not acknowledged (0 where
    the platform cannot tell, or on error)."""
    if _TIOCOUTQ is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), _TIOCOUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0
