"""An ASGI app served by uvicorn through its public API only: a ``uvicorn.Config``, a
``uvicorn.Server`` whose ``serve(sockets=[...])`` runs on a uvloop event loop in a thread of
its own, its ``started`` read and its ``should_exit`` set. No uvicorn class is subclassed
and no private attribute or argument is used (``tests/common/test_server_internals.py``).

The thread is not the main thread, so uvicorn installs no signal handler: the role's
process owns its signals (``runtime.web.stop``) and stops the server by calling ``stop``.

Stopping (``stop``): the caller has turned readiness false first. The connections already
waiting in the listen backlog are accepted (at most ``ACCEPT_DRAIN_S``), the listening
socket closed (asyncio's ``Server.close`` of uvicorn's ``servers``), and what the open
connections have already sent is read (at most ``ACCEPT_DRAIN_S``; ``HeadGuard.unread``), so
a request sent before the stop, whole or in part, is in flight; then uvicorn's graceful
shutdown: idle connections closed, the requests in flight finished and answered with
``Connection: close``, for at most ``ServerLimits.grace_period_s``; then the thread ends.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Callable, Optional

from runtime.web.limits import ACCEPT_DRAIN_S, ServerLimits, readable_now

log = logging.getLogger(__name__)

#: connections a listening socket holds before they are accepted
BACKLOG = 1024
#: s between two looks at the listen backlog while a stop drains it
_DRAIN_TICK_S = 0.01


def listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket listening on ``host:port`` (port 0: one the kernel picks; the bound one
    is ``getsockname()[1]``), ``SO_REUSEADDR`` on, and ``SO_REUSEPORT`` with ``reuse_port``
    (serving's workers each bind the same port: the kernel spreads new connections over
    them). Raises ``OSError`` when it cannot be bound."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def uvicorn_config(app, limits: ServerLimits, http: Optional[Callable] = None):
    """uvicorn's ``Config`` for ``app`` under ``limits``: httptools (or the protocol factory
    ``http``, e.g. ``runtime.web.heads.HeadGuard.protocol``), no WebSocket, no lifespan, no
    proxy headers (no ``X-Forwarded-*`` trusted), no access log and no logging setup of its
    own (the process's), keep-alive connections closed after ``idle_timeout_s`` idle,
    ``connection_limit`` connections and requests at once (beyond: 503),
    ``grace_period_s`` for the requests in flight at a stop."""
    import uvicorn

    return uvicorn.Config(app, http=http or "httptools", interface="asgi3", lifespan="off", access_log=False,
                          log_config=None, ws="none", proxy_headers=False,
                          timeout_keep_alive=limits.idle_timeout_s, limit_concurrency=limits.connection_limit,
                          timeout_graceful_shutdown=limits.grace_period_s, backlog=BACKLOG,
                          server_header=False)


class HttpServer:
    """``app`` (ASGI 3) served by uvicorn on the listening socket ``sock`` (``listen``), under
    ``limits``, in a thread of its own (module docstring), with the head limits of
    ``runtime.web.heads`` (``guard``: its ``HeadGuard``; ``heads=False``: none, uvicorn
    alone). ``name``: for log lines and the thread's name.

    ``start()`` returns once uvicorn serves (raises ``OSError`` when it could not start);
    ``stop()`` stops it gracefully and returns once it has stopped; ``port`` is the bound
    port, ``url`` its ``http://host:port``."""

    def __init__(self, app, sock: socket.socket, limits: ServerLimits, name: str = "http", heads: bool = True):
        import uvicorn

        from runtime.web.heads import HeadGuard

        self.sock, self.limits, self.name = sock, limits, name
        host, self.port = sock.getsockname()[:2]
        self.host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        self.guard = HeadGuard(limits) if heads else None
        if self.guard is not None:
            app = self.guard.wrap(app)
        self.server = uvicorn.Server(uvicorn_config(app, limits, self.guard.protocol() if self.guard else None))
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self._error: Optional[BaseException] = None

    @property
    def url(self) -> str:
        """``http://host:port`` (``127.0.0.1`` for a wildcard host)."""
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        import uvloop

        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                self._loop = runner.get_loop()
                runner.run(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # noqa: BLE001 - start() reports it (uvicorn exits on a failed startup)
            self._error = exc
            if not isinstance(exc, SystemExit):
                log.exception("%s: the HTTP server failed", self.name)

    def start(self, timeout_s: float = 30.0) -> "HttpServer":
        """Serves in a daemon thread; returns once uvicorn serves. Raises ``OSError`` when
        it stopped or did not start within ``timeout_s`` s."""
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"{self.name}: the HTTP server on {self.url} did not start ({self._error!r})")
            time.sleep(0.005)
        return self

    def request_stop(self) -> None:
        """Begins the graceful stop (module docstring) and returns at once. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        if self._loop is None or not self._thread or not self._thread.is_alive():
            self.sock.close()
            return
        try:
            asyncio.run_coroutine_threadsafe(self._drain_then_exit(), self._loop)
        except RuntimeError:  # the loop has just ended
            pass

    async def _drain_then_exit(self) -> None:
        t0 = time.monotonic()
        while readable_now(self.sock) and time.monotonic() - t0 < ACCEPT_DRAIN_S:
            await asyncio.sleep(_DRAIN_TICK_S)  # the backlog: connections made before the stop are served
        for listener in self.server.servers:  # asyncio's servers: no new connection from now on
            listener.close()
        t0 = time.monotonic()
        while self.guard is not None and self.guard.unread() and time.monotonic() - t0 < ACCEPT_DRAIN_S:
            await asyncio.sleep(_DRAIN_TICK_S)  # what open connections sent is read: those requests are in flight
        await asyncio.sleep(_DRAIN_TICK_S)
        self.server.should_exit = True

    def stop(self) -> None:
        """Graceful stop (module docstring); returns once the server has stopped (at most
        ``ACCEPT_DRAIN_S`` + ``grace_period_s`` + a few seconds). Idempotent."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(ACCEPT_DRAIN_S + self.limits.grace_period_s + 5)
            if self._thread.is_alive():
                log.warning("%s: the HTTP server still runs after its grace", self.name)
        self.sock.close()

    @property
    def stopped(self) -> bool:
        """True once the server has stopped (or never started)."""
        return self._thread is None or not self._thread.is_alive()
