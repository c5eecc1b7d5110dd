"""The limits on a request's head that uvicorn's public API lacks, for every role:
``ServerLimits.header_timeout_s`` (a head still incomplete that long after its first byte:
the connection is closed; slowloris), ``idle_timeout_s`` for a new connection that sends
nothing, and ``max_head_bytes`` (a head above it: answered 431 and closed). uvicorn bounds
a keep-alive connection's idle time between requests (``timeout_keep_alive``) and nothing
before the first request or while a head arrives.

``HeadGuard`` adds them from outside uvicorn, in two parts that meet on the connection's
peer address (uvicorn's ASGI ``scope["client"]`` is the socket's peer ``(host, port)``):

- ``protocol(...)``, the factory given to uvicorn as its ``http`` protocol: each
  connection's protocol is a ``_Guarded`` asyncio protocol holding uvicorn's own httptools
  protocol (composition, no subclass: every event is handed on unchanged). It starts a
  deadline when the connection is made and at the first byte of each request head, and
  counts the head's bytes;
- ``wrap(app)``, an ASGI middleware: uvicorn calls the app once a head is complete, so the
  middleware clears the deadline of that connection; once the app returned (the answer
  written), the connection's next byte starts the next head's deadline.

The deadlines are floats on each connection, checked by one sweep per event loop every
``head_sweep_s(limits)`` s while connections are open, so a request pays for no timer of
its own; a connection is closed at most one sweep interval after its deadline. A head's
bytes are counted as they arrive. A head still incomplete beyond ``max_head_bytes`` is
refused once the event loop ran the steps already due (a read may hold a whole head and a
large body: the app is then called first); a head that came whole is measured by the
middleware when the read held more than ``max_head_bytes``.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional

from runtime.web.limits import ServerLimits

log = logging.getLogger(__name__)

#: what a head above ``max_head_bytes`` is answered (RFC 6585, 431), before the connection closes
TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
             b"content-length: 52\r\nconnection: close\r\n\r\n"
             b'{"error": "request line and headers are too large"}\n')


def head_sweep_s(limits: ServerLimits) -> float:
    """Seconds between two checks of the head deadlines: a quarter of the shorter of
    ``header_timeout_s`` and ``idle_timeout_s``, within 0.05-1 s."""
    return min(1.0, max(0.05, min(limits.header_timeout_s, limits.idle_timeout_s) / 4))


def head_size(scope) -> int:
    """Bytes of a request's head as ASGI gives it (method, path, query, header names and
    values), within a few bytes of what the client sent."""
    return len(scope["method"]) + len(scope.get("raw_path") or scope["path"]) + len(scope["query_string"]) + sum(
        len(k) + len(v) + 4 for k, v in scope["headers"])


def httptools_protocol() -> Callable:
    """uvicorn's httptools protocol, as uvicorn's own ``Config`` resolves ``http="httptools"``
    (``Config.load``, ``http_protocol_class``): no import of uvicorn's protocol modules."""
    import uvicorn

    config = uvicorn.Config(_no_app, http="httptools", interface="asgi3", lifespan="off", log_config=None)
    config.load()
    return config.http_protocol_class


async def _no_app(scope, receive, send) -> None:  # pragma: no cover - never called
    raise RuntimeError("not served")


class _Guarded(asyncio.Protocol):
    """One connection: uvicorn's protocol ``inner`` with the head deadlines around it."""

    __slots__ = ("guard", "inner", "transport", "peer", "deadline", "why", "head_bytes", "in_request", "checking",
                 "started")

    def __init__(self, guard: "HeadGuard", inner: asyncio.Protocol):
        self.guard, self.inner = guard, inner
        self.transport = None
        self.peer = None
        self.deadline: Optional[float] = None
        self.why = "nothing sent"
        self.head_bytes = 0
        self.in_request = 0
        self.started = 0  # requests whose head was complete
        self.checking = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        guard = self.guard
        loop = guard.loop or guard.started(asyncio.get_running_loop())
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = (str(peer[0]), int(peer[1]))
            guard.conns[self.peer] = self
        self.deadline = loop.time() + guard.limits.idle_timeout_s
        guard.sweep_soon()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        idle = not self.in_request
        self.inner.data_received(data)  # a head completed here schedules the app's task first
        if idle:
            guard = self.guard
            if self.deadline is None or self.why == "nothing sent":  # the first byte of a head
                self.deadline = guard.loop.time() + guard.limits.header_timeout_s
                self.why = "request headers incomplete"
                self.head_bytes = 0
            self.head_bytes += len(data)
            if self.head_bytes > guard.limits.max_head_bytes and not self.checking:
                self.checking = True  # after the app's first step: a body in the same read is not head
                guard.loop.call_soon(self._check_size, self.started)

    def _check_size(self, started_before: int) -> None:
        self.checking = False
        if self.started == started_before and not self.in_request \
                and self.head_bytes > self.guard.limits.max_head_bytes:
            self.guard.refused += 1
            log.info("refused a request from %s: its head is above %d bytes", (self.peer or ("?",))[0],
                     self.guard.limits.max_head_bytes)
            self._close(TOO_LARGE)

    def head_done(self) -> None:
        self.started += 1
        self.in_request += 1
        self.deadline = None
        self.head_bytes = 0

    def answered(self) -> None:
        self.in_request -= 1

    def timed_out(self) -> None:
        why, limits = self.why, self.guard.limits
        self.guard.timeouts += 1
        log.info("closed a connection from %s: %s after %.0f s", (self.peer or ("?",))[0], why,
                 limits.idle_timeout_s if why == "nothing sent" else limits.header_timeout_s)
        self._close(b"")

    def _close(self, last: bytes) -> None:
        self.deadline = None
        if self.transport is not None and not self.transport.is_closing():
            if last:
                self.transport.write(last)
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if self.peer is not None and self.guard.conns.get(self.peer) is self:
            del self.guard.conns[self.peer]
        self.deadline = None
        self.inner.connection_lost(exc)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class HeadGuard:
    """The head limits of ``limits`` (module docstring) for one server (one event loop):
    give ``protocol()`` to uvicorn as its ``http`` and serve ``wrap(app)``. ``timeouts``:
    connections closed by a deadline; ``refused``: heads refused as too large."""

    def __init__(self, limits: ServerLimits, inner: Optional[Callable] = None):
        self.limits = limits
        self.inner = inner or httptools_protocol()
        self.interval = head_sweep_s(limits)
        self.conns: dict[tuple, _Guarded] = {}
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._sweep = None
        self.timeouts = 0
        self.refused = 0

    def started(self, loop: asyncio.AbstractEventLoop) -> asyncio.AbstractEventLoop:
        self.loop = loop
        return loop

    def protocol(self) -> Callable[..., asyncio.Protocol]:
        """The protocol factory for uvicorn's ``Config(http=...)``: uvicorn's own arguments
        go to its httptools protocol unchanged."""
        inner = self.inner

        def factory(*args, **kwargs) -> asyncio.Protocol:
            return _Guarded(self, inner(*args, **kwargs))

        return factory

    def wrap(self, app):
        """``app`` (ASGI 3) with the head deadlines cleared while it answers (module docstring)."""
        conns, max_head = self.conns, self.limits.max_head_bytes

        async def guarded(scope, receive, send) -> None:
            conn = conns.get(scope.get("client")) if scope["type"] == "http" else None
            if conn is None:
                return await app(scope, receive, send)
            if conn.head_bytes > max_head and head_size(scope) > max_head:  # a whole head too large
                self.refused += 1
                return conn._close(TOO_LARGE)
            conn.head_done()
            try:
                await app(scope, receive, send)
            finally:
                conn.answered()

        return guarded

    def unread(self) -> bool:
        """True while a connection has bytes not yet read or a head not yet complete."""
        from runtime.web.limits import readable_now

        for conn in self.conns.values():
            if conn.transport is None or conn.transport.is_closing():
                continue
            if (conn.deadline is not None and conn.why != "nothing sent") or readable_now(
                    conn.transport.get_extra_info("socket")):
                return True
        return False

    def sweep_soon(self) -> None:
        if self._sweep is None:
            self._sweep = self.loop.call_later(self.interval, self._check)

    def _check(self) -> None:
        now = self.loop.time()
        for conn in [c for c in self.conns.values() if c.deadline is not None and now >= c.deadline]:
            conn.timed_out()
        self._sweep = None
        if self.conns:  # the next connection starts it again otherwise
            self.sweep_soon()
