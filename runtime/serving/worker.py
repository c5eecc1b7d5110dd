"""One serving worker process (``runtime.serving.launcher`` forks ``--workers`` of them):
its data plane, the REST endpoints as an ASGI app (``runtime.serving.asgi``) served by
uvicorn (httptools' parser, uvloop) on a listening socket of its own, and its gRPC server.

Each worker binds ``host:port`` itself with ``SO_REUSEPORT``, once its model is loaded:
the kernel spreads new connections over the workers' sockets by a hash of the
connection's addresses and ports, so a client's keep-alive connections land on the
workers independently (with one socket shared, every idle worker wakes for a connection
and the first to accept takes it, so a client's few keep-alive connections can all land
on the one worker that happened to be first). The gRPC server listens the same way on
``--grpc-port``, started after the worker loaded its model (gRPC must not run in a
process that forks afterwards).

Stopping (SIGTERM from the launcher, or SIGINT): readiness turns false
(``DataPlane.draining``: ``/v2/health/ready`` and gRPC ``ServerReady`` answer not ready,
answers from then on say ``Connection: close``), gRPC takes no new call, and uvicorn stops
gracefully: the connections in its listen backlog accepted and what they sent read, its
listening socket closed, idle connections closed, the requests received or partly
received finish and are answered (``ServerLimits.shutdown_timeout_s``: the
``--graceful-timeout``); then the gRPC calls in flight finish (same grace) and the worker
ends (``runtime.serving.launcher.exit_now``).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from runtime.limits import ACCEPT_DRAIN_S, ServerLimits, readable_now
from runtime.serving.asgi import ServingApp
from runtime.serving.dataplane import DataPlane

if TYPE_CHECKING:
    from runtime.serving.grpc_server import GrpcServer

log = logging.getLogger(__name__)

#: connections a worker's listening socket holds before they are accepted
BACKLOG = 1024


@dataclass
class Transports:
    """One worker's serving, side by side: the data ``plane``, the ASGI ``app`` over it and
    the ``grpc`` server over it (None without a gRPC port; started by ``serve``)."""

    plane: DataPlane
    app: ServingApp
    grpc: Optional["GrpcServer"] = None


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` with ``SO_REUSEPORT`` (every worker binds
    its own: module docstring). Raises ``OSError`` when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def uvicorn_protocol(limits: ServerLimits):
    """uvicorn's httptools protocol class with the limits on a request's head that uvicorn
    lacks (``limits.header_timeout_s``, ``limits.max_head_bytes``, and ``idle_timeout_s``
    for a new connection that sends nothing), added around the parser's callbacks (the
    parsing stays httptools'; uvicorn takes the class as its ``http``).

    The two timeouts are deadlines kept on each connection (a float set when the
    connection is made and when a request begins, cleared when its head is complete) and
    checked by one sweep per event loop every ``head_sweep_s(limits)`` s while connections
    are open, so a request pays for no timer of its own (a timer armed and cancelled per
    request cost about 5 us of CPU, a tenth of uvicorn's own per-request cost); a
    connection is closed at most one sweep interval after its deadline."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    interval = head_sweep_s(limits)

    class Protocol(HttpToolsProtocol):
        """A connection is closed when its request head has not all arrived
        ``header_timeout_s`` after its first byte, or when nothing arrived
        ``idle_timeout_s`` after it was made (between requests, uvicorn's keep-alive
        timeout applies); a head above ``max_head_bytes`` is refused 400 (the callback's
        error makes uvicorn answer "Invalid HTTP request received.") and closed."""

        #: each event loop's pending sweep (``_sweep``); a loop has none while it holds no connection
        _sweeps: dict = {}
        #: loop time by which the head must be complete (None: no head awaited)
        _head_deadline: Optional[float] = None
        _head_why = "nothing sent"
        _head_bytes = 0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_deadline = self.loop.time() + limits.idle_timeout_s
            if self.loop not in self._sweeps:
                self._sweeps[self.loop] = self.loop.call_later(interval, _sweep, self.loop, self.connections)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            self._head_deadline = self.loop.time() + limits.header_timeout_s
            self._head_why = "request headers incomplete"

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value))
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._head_deadline = None
            super().on_headers_complete()

        def _count(self, n: int) -> None:
            self._head_bytes += n
            if self._head_bytes > limits.max_head_bytes:
                raise ValueError(f"request line and headers exceed {limits.max_head_bytes} bytes")

        def _head_timeout(self) -> None:
            self._head_deadline = None
            if not self.transport.is_closing():
                why = self._head_why
                log.info("closed a connection from %s: %s after %.0f s", (self.client or ("?",))[0], why,
                         limits.idle_timeout_s if why == "nothing sent" else limits.header_timeout_s)
                self.transport.close()

    def _sweep(loop, connections: set) -> None:
        now = loop.time()
        for conn in list(connections):
            deadline = getattr(conn, "_head_deadline", None)
            if deadline is not None and now >= deadline:
                conn._head_timeout()
        if connections:
            Protocol._sweeps[loop] = loop.call_later(interval, _sweep, loop, connections)
        else:  # the next connection starts it again
            del Protocol._sweeps[loop]

    return Protocol


def head_sweep_s(limits: ServerLimits) -> float:
    """Seconds between two checks of the request-head deadlines (``uvicorn_protocol``): a
    quarter of the shorter of ``header_timeout_s`` and ``idle_timeout_s``, within 0.05-1 s."""
    return min(1.0, max(0.05, min(limits.header_timeout_s, limits.idle_timeout_s) / 4))


def uvicorn_config(app: ServingApp, limits: ServerLimits):
    """uvicorn's ``Config`` for ``app`` under ``limits``: httptools (``uvicorn_protocol``)
    and uvloop, no WebSocket, no proxy headers (no ``X-Forwarded-*`` trusted), no access log
    and no logging setup of its own (the process's), keep-alive
    connections closed after ``idle_timeout_s`` idle, ``connection_limit`` connections and
    requests at once (beyond: 503), ``shutdown_timeout_s`` for the requests in flight at a
    stop."""
    import uvicorn

    return uvicorn.Config(app, http=uvicorn_protocol(limits), loop="uvloop", lifespan="off", access_log=False,
                          log_config=None, ws="none", proxy_headers=False,
                          timeout_keep_alive=limits.idle_timeout_s, limit_concurrency=limits.connection_limit,
                          timeout_graceful_shutdown=limits.shutdown_timeout_s, backlog=BACKLOG,
                          server_header=False)


def uvicorn_server():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, telling ``on_started`` once it serves and calling ``on_stop``
        at the first SIGTERM or SIGINT, before its own graceful shutdown begins (a signal
        before it serves: it starts, then stops at once)."""

        def __init__(self, config, on_started: Callable[[], None], on_stop: Callable[[], None]):
            super().__init__(config)
            self.on_started, self.on_stop = on_started, on_stop

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                self.on_started()

        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                self.on_stop()
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None) -> None:
            """Before uvicorn's own shutdown (which closes every connection with no request
            in flight at once): the connections already in the listen backlog are accepted
            (at most ``ACCEPT_DRAIN_S``), then the listening socket closed, then the loop
            reads what the open connections have sent (at most ``ACCEPT_DRAIN_S``), so a
            request sent before the stop is in flight, answered, rather than closed unread
            (the loop may lag behind while the inference threads hold the GIL)."""
            listeners = [sock for server in self.servers for sock in (server.sockets or ())]
            t0 = time.monotonic()
            while any(readable_now(s) for s in listeners) and time.monotonic() - t0 < ACCEPT_DRAIN_S:
                await asyncio.sleep(0.01)
            for server in self.servers:
                server.close()
            t0 = time.monotonic()
            while time.monotonic() - t0 < ACCEPT_DRAIN_S and any(
                    readable_now(c.transport.get_extra_info("socket")) for c in list(self.server_state.connections)
                    if c.transport is not None and not c.transport.is_closing()):
                await asyncio.sleep(0.01)
            await super().shutdown(sockets=sockets)

        @contextlib.contextmanager
        def capture_signals(self):
            """The worker installs ``handle_exit`` itself, before anything starts (``serve``):
            no moment without a handler, and no signal raised again after the stop."""
            yield

    return Server


def serve(t: Transports, host: str, port: int, limits: ServerLimits,
          on_started: Callable[[], None] = lambda: None) -> int:
    """Serves ``t`` in this process until SIGTERM or SIGINT (module docstring): REST on
    ``host:port`` (its own ``SO_REUSEPORT`` socket), gRPC if ``t.grpc``. ``on_started``
    is called once both listen. Returns the exit code (0) once everything stopped."""
    sock = listen(host, port)
    grace_s = limits.shutdown_timeout_s

    def on_stop() -> None:
        t.plane.draining = True  # readiness false first (REST and gRPC)
        if t.grpc is not None:  # no new calls; those in flight get the grace (waited for below)
            t.grpc.stop(grace_s, wait=False)

    server = uvicorn_server()(uvicorn_config(t.app, limits), on_started, on_stop)
    for sig in (signal.SIGTERM, signal.SIGINT):  # ours from now on, whatever was imported before
        signal.signal(sig, server.handle_exit)
        signal.siginterrupt(sig, False)  # no EINTR in the requests in flight
    if t.grpc is not None:
        t.grpc.start()
    server.run(sockets=[sock])
    if t.grpc is not None:
        t.grpc.stop(grace_s)
    t.app.close()
    return 0
