"""Serving's HTTP server: an asyncio event loop reading every connection with
``httptools``' parser (llhttp, Node.js's HTTP/1.1 parser, in C), serving a WSGI app whose
answers are whole byte strings (serving's ``runtime.serving.rest.RestApp``).

Why not waitress (``runtime.webserver``, which the other roles keep): for serving's small,
frequent requests its Python parser, poll loop and task machinery cost more than the
model run. Serving over one cube, both versions side by side (2 workers x 1 thread, ``wrk``
at 4 connections, 3 alternating rounds): CPU per request 1.07 -> 0.77 ms at batch 1, 2.64
-> 2.37 ms at batch 256 (README, Benchmarks, Serving against KServe).

What it keeps from ``runtime.webserver.WebServer`` (same limits, same meaning), and adds:

- whole requests, headers and body, are buffered by the loop before the app sees them: a
  client that sends slowly holds a socket, never a thread;
- ``header_timeout_s``: a request whose headers have not all arrived this long after its
  first byte is closed (slowloris); ``idle_timeout_s``: a connection with nothing received
  for this long (keep-alive between requests, a stalled body) is closed;
- ``max_body_bytes``: a larger body (``Content-Length``, or chunks adding up) is answered
  413 and the connection closed; request line and headers above ``MAX_HEAD_BYTES``: 431;
  bodies being received beyond ``max_buffered_bytes`` in all: 503; a request the parser
  refuses is answered 400 and closed;
- ``connection_limit`` open connections (beyond, new ones wait in the listen backlog);
- work (``is_work(method, path)``: serving's ``POST``) runs on ``threads`` work threads;
  with ``max_queue`` work requests already waiting for one, a new one is answered at once
  ``503`` with ``Retry-After: 1`` and ``{"error"}`` by the loop (the connection stays open)
  and ``on_reject`` is called; everything else (probes, metadata, metrics) is answered by
  the loop itself, so it answers while every work thread is busy;
- ``share`` (several processes serving one listening socket, as gunicorn's workers do): a
  process holding more open connections than the least loaded of the others leaves a
  pending connection to them. Every process polls the shared socket and whichever accepts
  first would take it, so a client's few long-lived keep-alive connections landed all on
  one process of two in 3 rounds of 8 of ``make bench-serving-peers``, the other idle. The
  process waits ``ACCEPT_DEFER_S`` at a time and takes the connection itself after
  ``ACCEPT_ESCAPE_S`` (the others busy or gone); while stopping it accepts at once;
- ``inline_budget_s``: while the server holds few connections (at most
  ``INLINE_CONNECTIONS``), few work requests wait (at most ``INLINE_DEPTH``) and none runs
  on a work thread, they run on the loop thread itself, one per turn of the loop (reads,
  probes and answers in between), without the hand-off to a work thread and back, each
  under that wait budget (``runtime.bounded``). One more waiting sends them all to the
  work threads, in order; with more connections every one goes there: under load the
  loop stays free for reads, probes and 503s. One that cannot finish within the budget
  without waiting (the app raises ``bounded.WouldBlock``: a cube reply late, another
  thread's batch in the way) runs again on a work thread from the start, and work
  requests stay off the loop for ``INLINE_COOLDOWN_S``. So a probe waits at most the
  budget plus one request's CPU; ``max_queue`` counts the requests waiting for either;
- stopping (``request_stop``): readiness false, the connections already in the listen
  backlog accepted (at most ``ACCEPT_DRAIN_S``), the listening sockets closed, every request
  received or partly received finishes and is answered with ``Connection: close``,
  connections idle for ``DRAIN_IDLE_S`` closed (up to ``shutdown_timeout_s``).

HTTP/1.1 as RFC 9112 has it for an origin server: keep-alive by default (HTTP/1.0 on
request), pipelined requests answered in order (one at a time per connection: its
reading pauses while one is in flight, and while the client leaves its answers unread
beyond the transport's high-water mark), ``Expect: 100-continue`` answered before the body
is read, chunked request bodies, ``HEAD`` answered without a body, a ``Date`` header; a
client that half-closes gets the answers to what it sent.
"""
from __future__ import annotations

import asyncio
import collections
import io
import json
import logging
import os
import queue
import socket
import sys
import threading
import time
from email.utils import formatdate
from typing import Callable, Protocol, Sequence
from urllib.parse import unquote_to_bytes

import httptools

from runtime import bounded
from runtime.limits import ACCEPT_DRAIN_S, DRAIN_IDLE_S, readable_now


def refuse_work(method, path, waiting, max_queue, on_reject):
    if on_reject is not None:
        on_reject()
    return f"{method} {path}: overloaded, {waiting} requests are already waiting (queue limit {max_queue}); retry later"

log = logging.getLogger(__name__)

#: bytes of a request line and headers (URL, names, values) accepted; more: 431 and closed
MAX_HEAD_BYTES = 64 << 10

#: s a process with more open connections than another leaves a pending one to the others, at a time
ACCEPT_DEFER_S = 0.005
#: s a pending connection waits at most for a less loaded process before a busier one takes it
ACCEPT_ESCAPE_S = 0.05

#: s requests stay off the loop thread after one could not finish within ``inline_budget_s``
INLINE_COOLDOWN_S = 1.0
#: work requests that may wait to run on the loop thread; one more sends them all to the work threads
INLINE_DEPTH = 4
#: open connections beyond which work requests run on the work threads only (many clients: the
#: loop stays free for reads, probes and 503s)
INLINE_CONNECTIONS = 8

#: the statuses this server answers itself (the app gives its own status line)
_REASONS = {400: "Bad Request", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}


class ConnectionShare(Protocol):
    """Open connections of the processes serving one listening socket (``HttpServer``'s
    ``share``; ``runtime.serving.worker.ConnectionShare`` is gunicorn's)."""

    def publish(self, connections: int) -> None:
        """This process now holds ``connections`` open connections."""

    def least(self, connections: int) -> bool:
        """True when no live process of the others holds fewer than ``connections``."""

    def leave(self) -> None:
        """This process accepts no more: the others no longer leave connections to it."""


class _Date:
    """The ``Date`` header's value (RFC 9110 IMF-fixdate), made once a second."""

    def __init__(self):
        self.second, self.value = -1, b""

    def get(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second, self.value = now, formatdate(now, usegmt=True).encode()
        return self.value


class _Request:
    """One request, whole: ``environ`` (WSGI), ``keep_alive`` (the client's wish and the
    protocol's default), ``head`` (answer without a body), ``work`` (for a work thread),
    ``http10`` (an HTTP/1.0 client: a kept connection is said ``keep-alive``)."""

    __slots__ = ("environ", "keep_alive", "head", "work", "http10")

    def __init__(self, environ: dict, keep_alive: bool, head: bool, work: bool, http10: bool):
        self.environ, self.keep_alive, self.head, self.work, self.http10 = environ, keep_alive, head, work, http10


class _Connection(asyncio.Protocol):
    """One client connection: parses what arrives, hands each whole request to the server
    (``HttpServer._dispatch``) one at a time, writes the answers in order."""

    def __init__(self, server: "HttpServer"):
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer: tuple = ("", 0)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.started: float | None = None  # monotonic s of the first byte of the request being received
        self.headers_done = False
        self.last_seen = time.monotonic()  # monotonic s of the last bytes received
        self.waiting: list[_Request] = []  # received whole, not yet run (pipelined)
        self.refusal: bytes | None = None  # a 400/413 to send once the request in flight is answered
        self.head_bytes = 0  # bytes of the request line and headers received
        self.held = 0  # bytes of the body being received, counted in the server's ``buffered``
        self.in_flight = False  # a request dispatched and not yet answered
        self.closing = False  # no more requests taken: closed once what is in flight is answered
        self.paused = False  # reading paused: a request in flight, or answers not yet sent
        self.write_blocked = False  # the transport's buffer is above its high-water mark

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername") or ("", 0)
        self.server.accepting_now -= 1
        self.server.connections.add(self)

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        self.closing = True
        self._release()
        self.server.connection_closed()

    def data_received(self, data: bytes) -> None:
        self.last_seen = time.monotonic()
        if self.closing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol upgrade here: the request is answered as it is (on_message_complete)
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed request: {exc}")

    def eof_received(self) -> bool:
        # the client sends nothing more: the request in flight is answered, then the
        # connection closes (_next). Reading is paused while a second one waits, so none
        # is left unread behind it.
        self.closing = True
        return self.in_flight  # False: asyncio closes the transport now

    def pause_writing(self) -> None:
        """The client does not read its answers as fast as it sends requests: no more
        read (so no more answers buffered) until the transport's buffer drains."""
        self.write_blocked = True
        if not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_blocked = False
        if not self.in_flight and not self.closing:
            self._next()  # the requests left waiting, then reading again

    # -- httptools callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.started = time.monotonic()
        self.url, self.headers, self.body, self.body_bytes, self.headers_done = b"", [], [], 0, False
        self.head_bytes = 0

    def on_url(self, url: bytes) -> None:
        if self.closing:
            return
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.closing:
            return
        self.headers.append((name, value))
        self._count_head(len(name) + len(value))

    def _count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD_BYTES and not self.closing:
            self.headers, self.url = [], b""
            self._refuse(431, f"request line and headers exceed {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        self.headers_done = True
        limit = self.server.max_body_bytes
        for name, value in self.headers:
            lname = name.lower()
            if lname == b"content-length":
                try:
                    n = int(value)
                except ValueError:
                    n = -1  # the parser refuses it
                if n > limit:
                    self._refuse(413, f"request body of {n} bytes exceeds the limit of {limit}")
                    return
            elif lname == b"expect" and value.lower() == b"100-continue" and not self.in_flight \
                    and not self.waiting:  # (behind a pipelined request it would come before that one's answer)
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self.closing:
            return
        self.body_bytes += len(body)
        if self.body_bytes > self.server.max_body_bytes:
            self._refuse(413, f"request body of more than {self.server.max_body_bytes} bytes")
            return
        server = self.server
        if server.buffered + len(body) > server.max_buffered_bytes:
            self._refuse(503, f"the server holds {server.buffered} bytes of request bodies being received "
                              f"(limit {server.max_buffered_bytes}); retry later")
            return
        server.buffered += len(body)
        self.held += len(body)
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.closing:
            return
        p = self.parser
        method = p.get_method().decode("latin-1")
        req = self.server._request(self, method, self.url, self.headers,
                                   self.body[0] if len(self.body) == 1 else b"".join(self.body),
                                   p.get_http_version(), p.should_keep_alive())
        self.started, self.headers, self.body = None, [], []
        self._release()
        self.waiting.append(req)
        if self.in_flight:
            if not self.paused:  # one at a time: no more read until this one is answered
                self.paused = True
                self.transport.pause_reading()
        else:
            self._next()

    def _release(self) -> None:
        """The body being received no longer counts in the server's ``buffered``."""
        self.server.buffered -= self.held
        self.held = 0

    # -- answers -------------------------------------------------------------------------------
    def _refuse(self, status: int, message: str) -> None:
        """Answers ``status`` with ``{"error": message}`` and closes (after what is in flight)."""
        self.closing = True
        self.body = []
        self._release()
        self.waiting.clear()
        body = json.dumps({"error": message}).encode()
        self.refusal = self.server._encode(status, [("Content-Type", "application/json")], body, False, False)
        if not self.in_flight:
            self._next()

    def answer(self, data: bytes, keep_alive: bool) -> None:
        """Writes the answer of the request in flight (loop thread; a work thread's answer
        comes through ``call_soon_threadsafe``) and moves on to the next request, if any."""
        self.in_flight = False
        t = self.transport
        if t is None or t.is_closing():
            return
        t.write(data)
        if not keep_alive:
            self.closing = True
        self._next()

    def _next(self) -> None:
        """Runs the requests waiting, in order, until one goes to a work thread or the
        transport's buffer is full; closes the connection when it is to close, else reads on
        once nothing waits."""
        t = self.transport
        while self.waiting and not self.closing and not self.write_blocked:
            out = self.server._dispatch(self, self.waiting.pop(0))
            if out is None:  # on a work thread: answer() comes back here
                return
            data, keep_alive = out
            t.write(data)
            if not keep_alive:
                self.closing = True
        if self.closing:
            self.waiting.clear()
            if self.refusal is not None:
                t.write(self.refusal)
                self.refusal = None
            t.close()
        elif self.paused and not self.write_blocked:
            self.paused = False
            t.resume_reading()

    def busy(self) -> bool:
        """A request being received, run or answered."""
        return (self.started is not None or self.in_flight or bool(self.waiting)
                or (self.transport is not None and self.transport.get_write_buffer_size() > 0))


class HttpServer:
    """A WSGI ``app`` served by an asyncio event loop (module docstring) on ``host:port``
    (``port=0``: any free port; the bound one is ``port`` after construction), or on
    already listening ``sockets`` (gunicorn's).

    The app must give its answer's body as byte strings (joined here) and should set
    ``Content-Length`` (set here otherwise).

    Args:
        app: the WSGI application.
        host, port: where to listen (ignored with ``sockets``).
        threads: work threads (requests of the app running at once).
        name: for log lines.
        shutdown_timeout_s: how long a stop waits for requests in flight (s).
        sockets: listening ``socket.socket`` objects to serve instead of binding.
        is_work: ``(method, path) -> bool``: run on a work thread (else by the loop).
        max_queue: work requests that may wait for a work thread (None: unbounded).
        on_reject: called (loop thread) for every request refused by ``max_queue``.
        header_timeout_s, idle_timeout_s, max_body_bytes (bytes), connection_limit: limits on
            clients (module docstring).
        max_buffered_bytes: bytes of request bodies being received, over every connection,
            the server holds at most; a body that would go beyond is answered 503 and its
            connection closed (many large uploads at once cannot exhaust the worker's memory).
            Default: 4 x ``max_body_bytes``, within 256 MiB .. 1 GiB.
        share: the open connections of the other processes serving ``sockets``.
        inline_budget_s: s a work request run on the loop thread may wait there (module
            docstring); None: every work request runs on a work thread.

    Raises ``OSError`` when the address cannot be bound, ``ValueError`` for ``threads`` < 1, a
    negative ``max_queue`` or ``max_buffered_bytes`` below ``max_body_bytes``.
    """

    #: s between two looks at timeouts, the stop request and ``on_tick``
    TICK_S = 0.1

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, threads: int = 1, name: str = "",
                 shutdown_timeout_s: float = 10.0, *, sockets: Sequence = (),
                 is_work: Callable[[str, str], bool] = lambda method, path: method == "POST",
                 max_queue: int | None = None, on_reject: Callable[[], None] | None = None,
                 header_timeout_s: float = 10.0, idle_timeout_s: float = 30.0, max_body_bytes: int = 1 << 40,
                 connection_limit: int = 1000, share: ConnectionShare | None = None,
                 max_buffered_bytes: int | None = None, inline_budget_s: float | None = None):
        if max_buffered_bytes is None:
            max_buffered_bytes = max(256 << 20, min(4 * max_body_bytes, 1 << 30))
        if max_buffered_bytes < min(max_body_bytes, 1 << 30):
            raise ValueError(f"max_buffered_bytes: {max_buffered_bytes} is below max_body_bytes {max_body_bytes}: "
                             "a request of the largest size allowed could never be received")
        if threads < 1:
            raise ValueError(f"threads: {threads}, at least 1 is needed")
        if max_queue is not None and max_queue < 0:
            raise ValueError(f"max_queue: {max_queue} is negative")
        if inline_budget_s is not None and inline_budget_s < 0:
            raise ValueError(f"inline_budget_s: {inline_budget_s} is negative")
        self.app, self.threads, self.name = app, threads, name or "http"
        self.shutdown_timeout_s = shutdown_timeout_s
        self.is_work, self.max_queue, self.on_reject = is_work, max_queue, on_reject
        self.header_timeout_s, self.idle_timeout_s = header_timeout_s, idle_timeout_s
        self.max_body_bytes, self.connection_limit, self.share = max_body_bytes, connection_limit, share
        self.max_buffered_bytes = max_buffered_bytes
        self.inline_budget_s = inline_budget_s
        self.outstanding = 0  # work requests queued or running on a work thread (loop thread's count)
        self._pending: collections.deque[tuple[_Connection, _Request]] = collections.deque()  # to run on the loop
        self._place_due = False  # _place scheduled
        self._inline_off_until = 0.0  # monotonic s: no request on the loop before then
        self.inlined = 0  # work requests run on the loop thread
        self.handed = 0  # of those, handed to a work thread (bounded.WouldBlock)
        self.threaded = 0  # work requests run on a work thread
        self.buffered = 0  # bytes of request bodies being received, over every connection
        self.ready, self.reason = False, "starting"
        self.draining = False
        self.header_timeouts = 0  # connections closed by header_timeout_s
        self.rejected = 0  # work requests answered 503 (max_queue)
        self.connections: set[_Connection] = set()
        self.accepting_now = 0  # accepted, protocol not yet made
        if sockets:
            self.sockets = list(sockets)
        else:
            s = socket.create_server((host, port), backlog=1024, reuse_port=False)
            self.sockets = [s]
        for s in self.sockets:
            s.setblocking(False)
        first = self.sockets[0].getsockname()
        self.host, self.port = first[0], int(first[1])
        self.work: queue.SimpleQueue = queue.SimpleQueue()  # _Connection, _Request; None stops a thread
        self._workers: list[threading.Thread] = []
        self._date = _Date()
        self._stop_requested = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False
        self._defer_until = 0.0  # monotonic s: connections left to the others until then
        self._defer_since: float | None = None  # monotonic s: the pending connection was first left
        self._resume_timer: asyncio.TimerHandle | None = None  # the one pending _resume_accepting
        self.deferred = 0  # connections left to the others at least once
        self.escaped = 0  # connections taken after ACCEPT_ESCAPE_S

    @property
    def url(self) -> str:
        """``http://host:port`` (``127.0.0.1`` for a wildcard host)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{host}:{self.port}"

    def open_connections(self) -> int:
        """Connections this server holds open now."""
        return len(self.connections) + self.accepting_now

    def queued(self) -> int:
        """Work requests waiting to run (on the loop thread or a work thread)."""
        return len(self._pending) + self.work.qsize()

    # -- requests -------------------------------------------------------------------------------
    def _request(self, conn: _Connection, method: str, url: bytes, headers: list[tuple[bytes, bytes]],
                 body: bytes, version: str, keep_alive: bool) -> _Request:
        q = url.find(b"?")
        path, query = (url, b"") if q < 0 else (url[:q], url[q + 1:])
        if path[:1] != b"/":  # absolute-form (a proxy's request line): its path
            try:
                path = httptools.parse_url(path).path or b"/"
            except httptools.HttpParserInvalidURLError:
                pass
        path_info = (unquote_to_bytes(path) if b"%" in path else path).decode("latin-1")
        environ = {"REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": path_info,
                   "QUERY_STRING": query.decode("latin-1"), "SERVER_NAME": self.host, "SERVER_PORT": str(self.port),
                   "SERVER_PROTOCOL": f"HTTP/{version}", "REMOTE_ADDR": conn.peer[0],
                   "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
                   "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": True,
                   "wsgi.run_once": False}
        for name, value in headers:
            key = name.decode("latin-1").upper().replace("-", "_")
            v = value.decode("latin-1")
            if key == "CONTENT_LENGTH" or key == "CONTENT_TYPE":
                environ[key] = v
            else:
                key = "HTTP_" + key
                environ[key] = environ[key] + "," + v if key in environ else v
        if "CONTENT_LENGTH" not in environ and body:  # chunked: the WSGI app reads by length
            environ["CONTENT_LENGTH"] = str(len(body))
        return _Request(environ, keep_alive, method == "HEAD", self.is_work(method, path_info), version == "1.0")

    def _dispatch(self, conn: _Connection, req: _Request) -> tuple[bytes, bool] | None:
        """Loop thread: runs ``req`` here or refuses it (503), returning ``(answer,
        keep_alive)``, or leaves it to be run (None; ``conn`` is then in flight): by the
        loop (``_place``) while requests run there, else by a work thread."""
        if not req.work:
            return self._run(req)
        waiting = len(self._pending) + self.work.qsize()
        if self.max_queue is not None and waiting >= self.max_queue:
            return self._refuse_work(req, waiting)
        conn.in_flight = True
        if len(self._pending) < INLINE_DEPTH and self._on_loop():
            self._pending.append((conn, req))  # the loop runs it, once no work thread runs one
            self._schedule_place()
        else:  # one too many (or not on the loop now): to the work threads, those waiting first
            self._to_threads()
            self._queue(conn, req)
        return None

    def _on_loop(self) -> bool:
        """Work requests run on the loop thread now (module docstring, ``inline_budget_s``)."""
        return self.inline_budget_s is not None and not self.draining \
            and len(self.connections) <= INLINE_CONNECTIONS \
            and (not self._inline_off_until or time.monotonic() >= self._inline_off_until)

    def _schedule_place(self) -> None:
        """``_place`` at the next turn of the loop, once no request runs on a work thread."""
        if self._pending and not self._place_due and not self.outstanding:
            self._place_due = True
            self._loop.call_soon(self._place)

    def _place(self) -> None:
        """Loop: runs the oldest work request waiting here under ``inline_budget_s``, then
        lets the loop turn before the next. One that cannot finish within the budget
        (``bounded.WouldBlock``) goes to the work threads with those waiting behind it, and
        requests stay off the loop for ``INLINE_COOLDOWN_S``."""
        self._place_due = False
        if not self._pending or self.outstanding:
            return
        if not self._on_loop():
            self._to_threads()
            return
        conn, req = self._pending.popleft()
        if conn.transport is None or conn.transport.is_closing():
            conn.in_flight = False  # the client went: nothing to answer
            self._schedule_place()
            return
        self.inlined += 1
        try:
            with bounded.budget(self.inline_budget_s):
                out = self._run(req)
        except bounded.WouldBlock as exc:
            self.handed += 1
            self._inline_off_until = time.monotonic() + INLINE_COOLDOWN_S
            log.info("%s: requests go to the work threads for %.0f s: %s", self.name, INLINE_COOLDOWN_S, exc)
            req.environ["wsgi.input"].seek(0)
            self._pending.appendleft((conn, req))
            self._to_threads()
            return
        conn.answer(*out)
        self._schedule_place()

    def _to_threads(self) -> None:
        """Loop: the requests waiting to run on the loop go to the work threads, in order
        (admitted already: no ``max_queue`` check)."""
        while self._pending:
            self._queue(*self._pending.popleft())

    def _queue(self, conn: _Connection, req: _Request) -> None:
        self.threaded += 1
        self.outstanding += 1
        self.work.put((conn, req))

    def _refuse_work(self, req: _Request, waiting: int) -> tuple[bytes, bool]:
        """Loop: the 503 of a work request refused by ``max_queue`` (``waiting`` already)."""
        keep = req.keep_alive and not self.draining
        self.rejected += 1
        e = req.environ
        body = json.dumps({"error": refuse_work(e["REQUEST_METHOD"], e["PATH_INFO"], waiting, self.max_queue,
                                                self.on_reject)}).encode()
        return self._encode(503, [("Content-Type", "application/json"), ("Retry-After", "1")], body,
                            keep, req.head, http10=req.http10), keep

    def _work(self) -> None:
        """A work thread: runs queued requests, hands each answer to the loop."""
        loop = self._loop
        while True:
            item = self.work.get()
            if item is None:
                return
            conn, req = item
            data, keep = self._run(req)
            try:
                loop.call_soon_threadsafe(self._answered, conn, data, keep)
            except RuntimeError:  # the loop is closed: the stop's deadline passed
                return

    def _answered(self, conn: _Connection, data: bytes, keep: bool) -> None:
        """Loop: a work thread's answer."""
        self.outstanding -= 1
        conn.answer(data, keep)
        self._schedule_place()

    def _run(self, req: _Request) -> tuple[bytes, bool]:
        """Runs the app on ``req``: ``(the whole answer encoded, keep_alive)``; the app's
        failure (or an answer that cannot be encoded) is a JSON 500."""
        state: list = []

        def start_response(status, headers, exc_info=None):
            state[:] = [status, headers]

        keep = req.keep_alive and not self.draining
        try:
            result = self.app(req.environ, start_response)
            try:
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
            status, headers = state
            return self._encode(int(status[:3]), headers, body, keep, req.head, status, req.http10), keep
        except Exception as exc:  # noqa: BLE001 - the app's bug is a 500, never a dead connection
            log.exception("%s: the app failed", self.name)
            body = json.dumps({"error": f"internal error: {exc.__class__.__name__}"}).encode()
            return self._encode(500, [("Content-Type", "application/json")], body, keep, req.head,
                                http10=req.http10), keep

    def _encode(self, code: int, headers: list, body: bytes, keep_alive: bool, head: bool,
                status: str | None = None, http10: bool = False) -> bytes:
        """The answer's bytes: status line, the app's headers (``Connection`` is this
        server's to say; ``Content-Length`` added when missing), ``Date``, the body (none
        for ``HEAD``)."""
        line = status or f"{code} {_REASONS.get(code, 'Error')}"
        out = [f"HTTP/1.1 {line}\r\n".encode("latin-1")]
        has_length = False
        for name, value in headers:
            low = name.lower()
            if low == "connection":
                continue
            has_length = has_length or low == "content-length"
            out.append(f"{name}: {value}\r\n".encode("latin-1"))
        if not has_length:
            out.append(b"Content-Length: %d\r\n" % len(body))
        end = (b"\r\nConnection: keep-alive\r\n\r\n" if http10 else b"\r\n\r\n") if keep_alive \
            else b"\r\nConnection: close\r\n\r\n"
        out.append(b"Date: " + self._date.get() + end)
        if not head:
            out.append(body)
        return b"".join(out)

    # -- connections ----------------------------------------------------------------------------
    def _acceptable(self, sock: socket.socket) -> None:
        """Loop: a connection is pending on ``sock``: take it, or leave it to a less loaded
        process for a while (``share``)."""
        now = time.monotonic()
        if self.share is not None and not self.draining:
            if self._defer_since is None or now - self._defer_since < ACCEPT_ESCAPE_S:
                if not self.share.least(self.open_connections()):
                    if self._defer_since is None:
                        self._defer_since = now
                        self.deferred += 1
                    self._pause_accepting(ACCEPT_DEFER_S)
                    return
            else:
                self.escaped += 1
        self._defer_since = None
        self._accept(sock)

    def _accept(self, sock: socket.socket) -> bool:
        """Accepts one connection from ``sock``; False when none was pending."""
        try:
            conn, _addr = sock.accept()
        except (BlockingIOError, InterruptedError):
            return False  # another process took it
        except OSError as exc:  # e.g. EMFILE: leave it in the backlog a while
            log.warning("%s: accept failed: %s", self.name, exc)
            self._pause_accepting(0.1)
            return False
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.accepting_now += 1  # counted until connection_made
        self._loop.create_task(self._adopt(conn))
        if self.open_connections() >= self.connection_limit:
            self._pause_accepting(None)
        if self.share is not None and not self.draining:
            self.share.publish(self.open_connections())
        return True

    async def _adopt(self, sock: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(lambda: _Connection(self), sock)
        except OSError:  # gone before the loop could take it
            self.accepting_now -= 1
            sock.close()

    def _start_accepting(self) -> None:
        if not self._accepting and not self.draining:
            for s in self.sockets:
                self._loop.add_reader(s.fileno(), self._acceptable, s)
            self._accepting = True

    def _pause_accepting(self, for_s: float | None) -> None:
        if self._accepting:
            for s in self.sockets:
                self._loop.remove_reader(s.fileno())
            self._accepting = False
        if for_s is not None:
            self._defer_until = time.monotonic() + for_s
            if self._resume_timer is not None:
                self._resume_timer.cancel()  # this pause replaces the one pending
            self._resume_timer = self._loop.call_later(for_s, self._resume_accepting)

    def _resume_accepting(self) -> None:
        """The pause of ``_pause_accepting(for_s)`` is over. No check of the clock here: a
        loop's timers may fire before ``time.monotonic()`` reaches ``_defer_until`` (uvloop's
        millisecond clock did, up to a millisecond early, while serving was tried on it),
        and a check that then did nothing left accepting paused until a connection closed
        (readiness probes waited 8 s under the overload of ``make bench-serving``)."""
        self._resume_timer = None
        if self.open_connections() < self.connection_limit:
            self._start_accepting()

    def connection_closed(self) -> None:
        """A connection went (loop thread)."""
        if not self._accepting and not self.draining and self.open_connections() < self.connection_limit \
                and time.monotonic() >= self._defer_until:
            self._start_accepting()
        if self.share is not None and not self.draining:
            self.share.publish(self.open_connections())

    def _sweep(self, now: float) -> None:
        """Closes connections past ``header_timeout_s`` (headers incomplete) or
        ``idle_timeout_s`` (nothing received, no request in flight)."""
        for c in list(self.connections):
            if c.in_flight or c.waiting or c.transport is None or c.transport.is_closing():
                continue
            if c.started is not None and not c.headers_done and now - c.started > self.header_timeout_s:
                self.header_timeouts += 1
                log.info("%s: closed a connection from %s: request headers incomplete after %.0f s",
                         self.name, c.peer[0], self.header_timeout_s)
                c.closing = True
                c.transport.close()
            elif now - c.last_seen > self.idle_timeout_s:
                c.closing = True
                c.transport.close()

    # -- the loop -------------------------------------------------------------------------------
    def serve(self, on_tick: Callable[[], None] | None = None) -> None:
        """Runs the event loop in this thread until a stop is requested, then stops
        gracefully (module docstring) and returns. ``on_tick`` is called every ``TICK_S`` s
        (e.g. a gunicorn worker's heartbeat, which may call ``request_stop``)."""
        loop = self._loop = asyncio.new_event_loop()
        self.ready, self.reason = True, ""
        try:
            for i in range(self.threads):
                t = threading.Thread(target=self._work, name=f"{self.name}-work-{i}", daemon=True)
                t.start()
                self._workers.append(t)
            loop.run_until_complete(self._main(on_tick))
        finally:
            for _ in self._workers:
                self.work.put(None)
            for t in self._workers:
                t.join(1.0)
            for c in list(self.connections):
                if c.transport is not None:
                    c.transport.abort()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()
            for s in self.sockets:
                s.close()
            if self.inline_budget_s is not None:
                log.info("%s: work requests run on the loop thread %d (%d of them then on a work thread), on a "
                         "work thread %d in all", self.name, self.inlined, self.handed, self.threaded)
            self._done.set()

    async def _main(self, on_tick: Callable[[], None] | None) -> None:
        self._start_accepting()
        if self.share is not None:
            self.share.publish(0)  # counted by the others from now on
        next_sweep = 0.0
        while not self._stop_requested.is_set():
            await asyncio.sleep(self.TICK_S)
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + min(0.5, self.header_timeout_s / 4)
                self._sweep(now)
            if self.share is not None:
                self.share.publish(self.open_connections())  # also the heartbeat the others count it by
            if on_tick is not None:
                on_tick()
        await self._drain(on_tick)

    async def _drain(self, on_tick: Callable[[], None] | None) -> None:
        self.ready, self.reason = False, self.reason or "stopping"
        self.draining = True  # answers from now on close their connection
        self._to_threads()
        t0 = time.monotonic()
        if self.share is not None:
            self.share.leave()
        self._pause_accepting(None)
        while time.monotonic() - t0 < ACCEPT_DRAIN_S and any(readable_now(s) for s in self.sockets):
            for s in self.sockets:  # the backlog: connections made before the stop are served
                while self._accept(s):
                    pass
            await asyncio.sleep(0.01)
        for s in self.sockets:
            s.close()
        deadline = t0 + self.shutdown_timeout_s
        idle_since: dict[_Connection, float] = {}
        while (now := time.monotonic()) < deadline:
            self._sweep(now)  # a request whose headers never end does not hold the stop to its deadline
            busy = self.work.qsize() > 0 or bool(self._pending)
            for c in list(self.connections):
                if c.busy() or (c.transport is not None and readable_now(c.transport.get_extra_info("socket"))):
                    busy = True
                    idle_since.pop(c, None)
                elif now - idle_since.setdefault(c, now) >= DRAIN_IDLE_S:
                    c.closing = True
                    c.transport.close()  # an idle keep-alive connection
            if not busy and not self.open_connections():
                return
            await asyncio.sleep(0.02)
            if on_tick is not None:
                on_tick()
        log.warning("%s: %d connection(s) still busy after %.0f s, closing them", self.name,
                    len(self.connections), self.shutdown_timeout_s)

    # -- start and stop ------------------------------------------------------------------------
    def start(self) -> "HttpServer":
        """Serves in a daemon thread; returns at once (the socket is already bound)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve, name=f"{self.name}-http", daemon=True)
            self._thread.start()
            log.info("%s listening on %s (pid %d)", self.name, self.url, os.getpid())
        return self

    def request_stop(self, reason: str = "stopping") -> None:
        """Readiness false; the loop stops gracefully at its next tick (any thread)."""
        self.ready, self.reason = False, reason
        self._stop_requested.set()

    def stop(self) -> None:
        """Graceful stop; returns once the loop ended. Idempotent."""
        self.request_stop(self.reason if not self.ready and self.reason else "stopping")
        if self._thread is not None:
            self._thread.join(self.shutdown_timeout_s + ACCEPT_DRAIN_S + 5)
        elif not self._done.is_set():
            for s in self.sockets:
                s.close()
            self._done.set()

    def __enter__(self) -> "HttpServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
