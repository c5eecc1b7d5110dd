"""The cube server's data plane: the binary lookup protocol (``runtime/cube/protocol.py``,
its one owner: frame sizes, layout, flags) over TCP.

Per request: ``recv_into`` a per-connection preallocated buffer, one C call
(``kernel.c`` ``cube_view_lookup``, GIL released) that probes the served version's
view (``runtime/cube/views.py``: its overlay tables newest first, then its base) and
writes the found mask and the values straight into a preallocated reply buffer, one
send (``runtime/cube/server/conn.py``: the connections' buffers and that answer). No
per-key Python, no per-request allocation (buffers grow only for bigger batches).

I/O mode: ``epoll`` (default) multiplexes every connection on one thread; ``threads``
runs a blocking loop per connection and pays for GIL hand-offs between them.

Stopping (``drain``): no new connection; every request received (a frame partly received
included) is answered, and each connection is closed once nothing on it is unanswered
(``runtime/cube/server/sockets.py``: nothing unread, every reply byte acknowledged).
"""
from __future__ import annotations

import logging
import select
import socket
import threading
import time

import numpy as np

from runtime.cube import protocol
from runtime.cube.server.conn import Conn, ConnStats, answerer, idle
from runtime.cube.server.sockets import send_nonblocking
from runtime.cube.server.versions import Versions
from runtime.cube.views import VersionView

log = logging.getLogger(__name__)


def warm_kernel() -> None:
    """Runs the kernel once so the first request pays no load/compile cost."""
    VersionView.of_base(np.arange(4, dtype=np.uint64), np.ones((4, 1), np.float32), 1).patched(
        np.arange(2, 6, dtype=np.uint64), np.ones((4, 1), np.float32), 2).folded().lookup(np.arange(8, dtype=np.uint64))


class LookupServer:
    """The data plane of one server: answers lookups from ``versions.served``.

    ``max_keys``: largest batch accepted (bigger frames get TOO_LARGE and the connection
    is closed). ``io_mode``: "epoll" or "threads" (``ValueError`` otherwise). ``listen()``
    binds ``host:port`` (0 = any free port; ``port`` then holds the bound one), ``serve()``
    starts the threads; ``drain(grace_s)``, ``halt()`` and ``close()`` stop it."""

    def __init__(self, versions: Versions, host: str, port: int, max_keys: int, io_mode: str):
        if io_mode not in ("threads", "epoll"):
            raise ValueError(f"io_mode must be threads or epoll, got {io_mode!r}")
        self.versions = versions
        self.host, self.port = host, port
        self.max_keys = max_keys
        self.max_frame = protocol.request_size(max_keys) - protocol.LEN.size  # largest length field
        self.io_mode = io_mode
        self._ep = select.epoll() if io_mode == "epoll" else None
        self._econns: dict[int, Conn] = {}
        self._stats: list[ConnStats] = []
        self._closed_stats = ConnStats()
        self._conns: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        self._stop = threading.Event()
        self._draining = threading.Event()  # graceful stop: close each connection once idle
        self._tconns: dict[socket.socket, Conn] = {}  # threads mode: the connections' state
        self._sock: socket.socket | None = None
        self._answer = answerer(self)  # the hot path: answer(c: Conn) -> bool (False: close c)

    # ------------------------------------------------------------------ lifecycle
    def listen(self) -> None:
        """Binds and listens on ``host:port``; sets ``port`` to the bound port. Raises ``OSError``."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, self.port))
        s.listen(1024)
        self._sock = s
        self.port = s.getsockname()[1]

    def serve(self) -> None:
        """Starts the accept thread (and, in epoll mode, the epoll thread)."""
        threading.Thread(target=self._accept_loop, name="cube-accept", daemon=True).start()
        if self.io_mode == "epoll":
            threading.Thread(target=self._epoll_loop, name="cube-epoll", daemon=True).start()

    @property
    def connections(self) -> int:
        """Open data-plane connections."""
        return len(self._conns)

    def drain(self, grace_s: float) -> None:
        """Accepts no new connection; ``grace_s`` > 0: waits up to ``grace_s`` s while
        every request already received is answered and each connection is closed once
        nothing on it is unanswered (the ones left are logged; ``close`` shuts them)."""
        self._draining.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
            except OSError:
                pass
            self._sock.close()
        if grace_s > 0:
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                if self.io_mode == "threads":
                    self._close_idle_threads()
                with self._conn_lock:
                    if not self._conns:
                        break
                time.sleep(0.02)
            with self._conn_lock:
                left = len(self._conns)
            if left:
                log.warning("%d data-plane connection(s) still busy after %.1f s: closing them", left, grace_s)

    def halt(self) -> None:
        """Stops the accept and epoll loops (threads mode: each connection's loop ends when
        its connection is shut); idempotent."""
        self._stop.set()

    def close(self) -> None:
        """``halt()``, then shuts every connection left; idempotent."""
        self._stop.set()
        with self._conn_lock:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _close_idle_threads(self) -> None:
        """threads mode, stopping: ends the read of each connection holding no partial
        request and nothing unread (its thread's ``recv`` returns 0 and it closes)."""
        for sock, c in list(self._tconns.items()):
            if idle(sock, c):
                try:
                    sock.shutdown(socket.SHUT_RD)
                except OSError:
                    pass

    # ------------------------------------------------------------------ connections
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stop.is_set() or self._draining.is_set():
                    return
                time.sleep(0.01)
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.io_mode == "threads":
                threading.Thread(target=self._serve_conn, args=(conn,), name="cube-conn", daemon=True).start()
            else:
                self._epoll_add(conn)

    def _register(self, sock) -> ConnStats:
        st = ConnStats()
        with self._conn_lock:
            self._conns.add(sock)
            self._stats.append(st)
        return st

    def _unregister(self, sock, st: ConnStats) -> None:
        with self._conn_lock:
            self._conns.discard(sock)
            if st in self._stats:
                self._stats.remove(st)
            c = self._closed_stats
            c.requests += st.requests
            c.keys += st.keys
            c.hits += st.hits
            for k, v in st.errors.items():
                c.errors[k] = c.errors.get(k, 0) + v
        sock.close()

    def _serve_conn(self, sock: socket.socket) -> None:
        """threads mode: one blocking loop per connection."""
        c = Conn(sock, self._register(sock), sock.sendall)
        self._tconns[sock] = c
        recv_into = sock.recv_into
        try:
            while True:
                n = recv_into(c.rin.mv[c.have:])
                if not n:
                    return
                c.have += n
                if not self._answer(c):
                    return
                if self._draining.is_set() and idle(sock, c):
                    return  # stopping: everything received is answered and delivered
        except (ConnectionError, OSError):
            pass
        except Exception:  # a bug must not take the server down: log, drop this connection
            log.exception("data-plane connection failed")
        finally:
            self._tconns.pop(sock, None)
            self._unregister(sock, c.st)

    # epoll mode: one thread multiplexes every connection (no GIL hand-offs between threads)
    def _epoll_add(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        c = Conn(sock, self._register(sock), None)
        c.send = lambda data, _s=sock: send_nonblocking(_s, data)
        self._econns[sock.fileno()] = c
        self._ep.register(sock.fileno(), select.EPOLLIN)

    def _epoll_loop(self) -> None:
        ep, conns = self._ep, self._econns
        while not self._stop.is_set():
            draining = self._draining.is_set()
            try:
                events = ep.poll(0.02 if draining else 0.5)
            except InterruptedError:
                continue
            for fd, _ in events:
                c = conns.get(fd)
                if c is None:
                    continue
                keep = True
                try:
                    n = c.sock.recv_into(c.rin.mv[c.have:])
                    if not n:
                        keep = False
                    else:
                        c.have += n
                        keep = self._answer(c)
                except (BlockingIOError, InterruptedError):
                    continue
                except (ConnectionError, OSError):
                    keep = False
                except Exception:
                    log.exception("data-plane connection failed")
                    keep = False
                if not keep:
                    self._epoll_close(fd, c)
            if draining:  # stopping: close each connection with nothing left to answer
                for fd, c in list(conns.items()):
                    if idle(c.sock, c):
                        self._epoll_close(fd, c)

    def _epoll_close(self, fd: int, c: Conn) -> None:
        try:
            self._ep.unregister(fd)
        except (OSError, ValueError):
            pass
        self._econns.pop(fd, None)
        self._unregister(c.sock, c.st)

    # ------------------------------------------------------------------ requests
    def _error(self, c: Conn, status: int, rid: int, msg: str, close: bool = True) -> None:
        """Sends ``c`` an error reply (``protocol.encode_error``: ``status`` != OK, request
        id ``rid``, the versions held, ``msg``) and counts it; ``close``: logged, the caller
        then closes the connection. A failed send is ignored."""
        c.st.errors[status] = c.st.errors.get(status, 0) + 1
        cur, prev = self.versions.served
        frame = protocol.encode_error(status, rid, cur.version if cur else 0, prev.version if prev else 0, msg)
        if close:
            log.warning("data plane: %s: %s; closing the connection", protocol.STATUS_NAMES[status], msg)
        try:
            c.send(frame)
        except OSError:
            pass

    def counters(self) -> dict:
        """``{"requests", "keys_looked_up", "hits", "errors": {status name: count}}`` over
        every connection, open or closed."""
        with self._conn_lock:
            stats = self._stats + [self._closed_stats]
            out = {"requests": sum(s.requests for s in stats), "keys_looked_up": sum(s.keys for s in stats),
                   "hits": sum(s.hits for s in stats), "errors": {}}
            for s in stats:
                for k, v in s.errors.items():
                    name = protocol.STATUS_NAMES[k]
                    out["errors"][name] = out["errors"].get(name, 0) + v
        return out
