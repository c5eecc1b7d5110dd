"""The roles' HTTP server: the file server, the cube server's control port, the cube
agent and the cube transfer serve their Flask (WSGI) apps through ``WebServer`` in their
process. The limits on clients are a ``runtime.limits.ServerLimits``, the policy serving's
uvicorn workers take too (``docs/serving-servers.md`` says why these roles stay on
waitress).

waitress (the Pylons project's WSGI server): its event loop (``waitress.wasyncore``) reads
every connection and buffers a whole request, headers and body (bodies above 512 KiB
spooled to a temporary file), before a thread of the pool sees it, so a client that sends
slowly holds a socket, never a thread; probes and other clients are answered meanwhile
(gunicorn's sync and threaded workers, and cheroot, give a thread to a connection as soon
as it is readable and read the request in it: 4 clients sending a header line per second
took every thread). Limits on what a client may hold (``ServerLimits``): the header
timeout (slowloris), the idle timeout (waitress's ``channel_timeout``), the largest body
(413 by waitress), the open connections (beyond, new ones wait in the listen backlog).

Two thread pools: ``threads`` for the work, ``control_threads`` for what must answer while
the work is busy (``is_work(method, path)`` false: e.g. the probes). With
``max_queue``, a work request arriving while ``max_queue`` others already wait for a
work thread is answered at once ``503`` with ``Retry-After`` and a JSON ``{"error"}``
(``QueueFull``; the connection stays open) by the event loop itself, never queued, so a
flood of refusals takes no thread from the probes.

Every app served with ``probes=True`` (the roles) also answers, ahead of its own routes:

- ``GET /healthz``: 200 ``{"status": "ok"}`` while the process is up (liveness);
- ``GET /readyz``: 200 ``{"ready": true}`` while serving, 503 ``{"ready": false, "reason"}``
  once it is stopping (readiness), so a load balancer takes it out before it goes.

``json_errors(app)`` makes a Flask app answer every HTTP error (unknown path 404, wrong
method 405, ``abort(...)``) as JSON ``{"error": "..."}``, as the roles' own errors are.

Stopping (``stop``, or ``request_stop`` while ``serve`` runs the loop): readiness false,
connections already waiting in the listen backlog accepted (at most ``ACCEPT_DRAIN_S``),
the listening sockets closed, then every request received or partly received finishes
and its answer is sent with ``Connection: close`` (a keep-alive client sending request
after request lets go after its answer), connections idle for ``DRAIN_IDLE_S`` are closed
(up to the limits' ``shutdown_timeout_s``).
``serve_forever`` runs a role's server in the main thread's stead until SIGTERM or
SIGINT: readiness turns false, ``on_stop`` runs (the role stops its own work), requests
in flight finish, and it returns so the process exits 0.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections import deque
from typing import Callable

from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server
from waitress.task import ErrorTask, ThreadedTaskDispatcher, WSGITask
from waitress.utilities import Error

from runtime.limits import ACCEPT_DRAIN_S, DRAIN_IDLE_S, ServerLimits, readable_now

log = logging.getLogger(__name__)
# waitress warns "Task queue depth is N" at every request queued behind busy threads: under
# load that is every request (the queue is bounded by max_queue and visible in metrics)
logging.getLogger("waitress.queue").setLevel(logging.ERROR)

#: bytes read from a connection at a time (waitress's 8 KiB took 13 reads for a 99 KB request
#: of 256 rows); below glibc's mmap threshold, so a small read allocates no mapping
RECV_BYTES = 64 << 10


def _json(start_response, status: str, body: dict) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def json_errors(app):
    """Registers on the Flask ``app`` one handler for every werkzeug ``HTTPException``: the
    answer is its status (and headers, e.g. ``Allow`` on a 405) with the JSON body
    ``{"error": "<METHOD> <path>: <what>"}``, ``<what>`` being the description given to
    ``abort`` or else the status name in lower case (``not found``, ``method not
    allowed``). Returns ``app``. Handlers the app registers for a specific status or
    exception class still take precedence (Flask picks the most specific)."""
    from flask import jsonify, request
    from werkzeug.exceptions import HTTPException

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        custom = exc.description and exc.description != type(exc).description
        what = exc.description if custom else exc.name.lower()
        resp = jsonify(error=f"{request.method} {request.path}: {what}")
        resp.status_code = exc.code or 500
        for name, value in exc.get_headers():
            if name.lower() != "content-type":
                resp.headers[name] = value
        return resp

    return app


class QueueFull(Error):
    """waitress's error answer for a work request refused because ``max_queue`` requests
    already wait: ``503`` with ``Retry-After: <retry_after_s>`` and the JSON body
    ``{"error": message}`` (``ServerLimits.overloaded_message``); the connection stays
    open (``_ErrorTask``)."""

    code = 503
    reason = "Service Unavailable"

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def to_response(self, ident=None):
        body = json.dumps({"error": self.body}).encode()
        return (f"{self.code} {self.reason}",
                [("Content-Type", "application/json"), ("Retry-After", str(self.retry_after_s))], body)


class _ClosingWhenDraining:
    """Mixin for waitress's tasks: once the channel's server is stopping
    (``_Channel.draining``), the answer says ``Connection: close`` and the connection is
    closed once it is sent, so a keep-alive client sending request after request lets go
    of the connection after its answer instead of holding the drain to its timeout."""

    def build_response_header(self):
        if self.channel.draining and not self.close_on_finish:
            self.set_close_on_finish()
        return super().build_response_header()


class _WSGITask(_ClosingWhenDraining, WSGITask):
    pass


class _ErrorTask(_ClosingWhenDraining, ErrorTask):
    """waitress's error answer, but a ``QueueFull`` one keeps the connection open (the
    request was read whole: the client may send its next one on it), unless draining."""

    def execute(self):
        e = self.request.error
        if not isinstance(e, QueueFull):
            return super().execute()
        self.status, headers, body = e.to_response()
        self.response_headers.extend(headers)
        self.content_length = len(body)
        self.write(body)


class _Channel(HTTPChannel):
    task_class = _WSGITask
    error_task_class = _ErrorTask

    @property
    def draining(self) -> bool:
        """True once the listener that accepted this connection is stopping
        (``WebServer._drain``): every answer from then on closes its connection."""
        return getattr(self.server, "elastic_draining", False)


def _probe_or_not_post(method: str, path: str) -> bool:
    return path not in ("/healthz", "/readyz")


class _Pools:
    """waitress's task dispatcher (``add_task``, ``shutdown``) over a work pool and a
    control pool (module docstring). ``add_task`` runs in the event loop thread."""

    def __init__(self, threads: int, control_threads: int, is_work: Callable[[str, str], bool],
                 limits: ServerLimits, on_reject: Callable[[], None] | None):
        self.work = ThreadedTaskDispatcher()
        self.work.set_thread_count(threads)
        self.control = None
        if control_threads > 0:
            self.control = ThreadedTaskDispatcher()
            self.control.set_thread_count(control_threads)
        self.is_work, self.limits, self.on_reject = is_work, limits, on_reject
        self.rejected = 0  # work requests answered 503 (QueueFull)
        self.rejects: deque[HTTPChannel] = deque()  # answered by the event loop (WebServer._step)

    def add_task(self, channel: HTTPChannel) -> None:
        req = channel.requests[0]
        if req.error is not None or not self.is_work(req.command, req.path):
            return (self.control or self.work).add_task(channel)
        max_queue = self.limits.max_queue
        if max_queue is not None and len(self.work.queue) >= max_queue:
            if self.on_reject is not None:
                try:
                    self.on_reject()
                except Exception:  # noqa: BLE001 - counting must not stop the loop
                    log.exception("on_reject failed")
            req.error = QueueFull(self.limits.overloaded_message(req.command, req.path, len(self.work.queue)),
                                  self.limits.retry_after_s)
            self.rejected += 1
            self.rejects.append(channel)  # a few bytes to write: no thread needed
            return None
        self.work.add_task(channel)

    def queued(self) -> int:
        return len(self.work.queue) + (len(self.control.queue) if self.control else 0)

    def shutdown(self, timeout: float = 5.0) -> None:
        for d in (self.work, self.control):
            if d is not None:
                d.shutdown(cancel_pending=True, timeout=timeout)


class WebServer:
    """A WSGI ``app`` served by waitress (module docstring) on ``host:port`` (``port=0``:
    any free port; the bound one is ``port`` after construction).

    Args:
        app: the WSGI application.
        host, port: where to listen.
        threads: work threads (concurrent requests of the app).
        name: for log lines.
        limits: the limits on clients (``ServerLimits``: header and idle timeouts, largest
            body, open connections, ``max_queue`` work requests waiting for a work thread,
            ``shutdown_timeout_s`` for the requests in flight at a stop).
        probes: answer ``/healthz`` and ``/readyz`` ahead of the app.
        control_threads: threads for requests ``is_work`` says are not work (0: one pool).
        is_work: ``(method, path) -> bool``; by default everything but the probes.
        on_reject: called (event loop thread) for every request refused by ``max_queue``.

    Raises ``OSError`` when the address cannot be bound, ``ValueError`` for ``threads`` < 1.
    """

    #: seconds the event loop waits for an event before it looks at timeouts and stops
    TICK_S = 0.1

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, threads: int = 8, name: str = "", *,
                 limits: ServerLimits = ServerLimits(), probes: bool = True,
                 control_threads: int = 1, is_work: Callable[[str, str], bool] = _probe_or_not_post,
                 on_reject: Callable[[], None] | None = None):
        if threads < 1:
            raise ValueError(f"threads: {threads}, at least 1 is needed")
        self.app = app
        self.name = name or "http"
        self.ready = False
        self.reason = "starting"
        self.limits = limits
        self.shutdown_timeout_s = limits.shutdown_timeout_s
        self.header_timeout_s = limits.header_timeout_s
        self.header_timeouts = 0  # connections closed by the header timeout
        self.pools = _Pools(threads, control_threads, is_work, limits, on_reject)
        self._map: dict = {}
        server = create_server(
            self._dispatch if probes else app, map=self._map, _dispatcher=self.pools, host=host, port=port,
            channel_timeout=max(1, round(limits.idle_timeout_s)), cleanup_interval=1,
            max_request_body_size=limits.max_body_bytes, max_request_header_size=limits.max_head_bytes,
            connection_limit=limits.connection_limit,
            asyncore_use_poll=True,
            ident=self.name, clear_untrusted_proxy_headers=False, backlog=1024, recv_bytes=RECV_BYTES,
            # a client that resets or leaves is not the server's error: no traceback in the role's log (the
            # apps served here answer their own exceptions: Flask's 500, serving's RestApp)
            log_socket_errors=False)
        for listener in self._listeners():
            listener.channel_class = _Channel
        first = server if isinstance(server, BaseWSGIServer) else self._listeners()[0]
        self.host = host
        self.port = int(first.effective_port)
        self._stop_requested = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_check = 0.0

    @property
    def url(self) -> str:
        """``http://host:port`` (``127.0.0.1`` for a wildcard host)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def _dispatch(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") == "GET":
            if path == "/healthz":
                return _json(start_response, "200 OK", {"status": "ok"})
            if path == "/readyz":
                if self.ready:
                    return _json(start_response, "200 OK", {"ready": True})
                return _json(start_response, "503 Service Unavailable", {"ready": False, "reason": self.reason})
        return self.app(environ, start_response)

    # -- the event loop ------------------------------------------------------------------------
    def _listeners(self) -> list[BaseWSGIServer]:
        return [d for d in self._map.values() if isinstance(d, BaseWSGIServer)]

    def _channels(self) -> list[HTTPChannel]:
        return [d for d in self._map.values() if isinstance(d, HTTPChannel)]

    def _step(self) -> None:
        wasyncore.loop(timeout=self.TICK_S, map=self._map, use_poll=True, count=1)
        rejects = self.pools.rejects
        while rejects:  # 503s (QueueFull), written here, outside waitress's received()
            rejects.popleft().service()
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + min(0.5, self.header_timeout_s / 4)
            self._close_slow_headers(now)

    def _close_slow_headers(self, now: float) -> None:
        """Closes connections whose request headers are still incomplete
        ``header_timeout_s`` after their first byte was seen."""
        for ch in self._channels():
            req = ch.request  # the request being received (None between requests)
            if req is None or req.headers_finished:
                continue
            first = getattr(req, "elastic_first_seen", None)
            if first is None:
                req.elastic_first_seen = now
            elif now - first > self.header_timeout_s and not ch.will_close:
                ch.will_close = True
                self.header_timeouts += 1
                log.info("%s: closed a connection from %s: request headers incomplete after %.0f s",
                         self.name, ch.addr, self.header_timeout_s)

    def serve(self, on_tick: Callable[[], None] | None = None) -> None:
        """Runs the event loop in this thread until a stop is requested, then stops
        gracefully (module docstring) and returns. ``on_tick`` is called at least every
        ``TICK_S`` s (e.g. a heartbeat, which may call ``request_stop``)."""
        self.ready, self.reason = True, ""
        try:
            while not self._stop_requested.is_set():
                self._step()
                if on_tick is not None:
                    on_tick()
            self._drain(on_tick)
        finally:
            self._done.set()

    def _drain(self, on_tick: Callable[[], None] | None) -> None:
        self.ready, self.reason = False, self.reason or "stopping"
        t0 = time.monotonic()
        listeners = self._listeners()
        for s in listeners:  # answers from now on say Connection: close (_ClosingWhenDraining)
            s.elastic_draining = True
        while time.monotonic() - t0 < ACCEPT_DRAIN_S and any(readable_now(s.socket) for s in listeners):
            self._step()  # the backlog: connections made before the stop are served
            if on_tick is not None:
                on_tick()
        for s in listeners:
            wasyncore.dispatcher.close(s)  # the listening socket only (its trigger stays)
        deadline = t0 + self.shutdown_timeout_s
        idle_since: dict[HTTPChannel, float] = {}
        while (now := time.monotonic()) < deadline:
            busy = self.pools.queued() > 0 or bool(self.pools.rejects)
            for ch in self._channels():
                if ch.requests or ch.request is not None or ch.total_outbufs_len or readable_now(ch.socket):
                    busy = True  # a request being received, run or answered (or bytes not yet read)
                    idle_since.pop(ch, None)
                elif not ch.will_close and now - idle_since.setdefault(ch, now) >= DRAIN_IDLE_S:
                    ch.will_close = True  # idle keep-alive connection: closed by the loop
            if not busy and not self._channels():
                break
            self._step()
            if on_tick is not None:
                on_tick()
        else:
            log.warning("%s: %d connection(s) still busy after %.0f s, closing them", self.name,
                        len(self._channels()), self.shutdown_timeout_s)
        self.pools.shutdown()
        wasyncore.close_all(self._map)

    # -- start and stop ------------------------------------------------------------------------
    def start(self) -> "WebServer":
        """Serves in a daemon thread; returns at once (the socket is already bound)."""
        if self._thread is None:
            self.ready, self.reason = True, ""
            self._thread = threading.Thread(target=self.serve, name=f"{self.name}-http", daemon=True)
            self._thread.start()
            log.info("%s listening on http://%s:%d (pid %d)", self.name, self.host, self.port, os.getpid())
        return self

    def request_stop(self, reason: str = "stopping") -> None:
        """Readiness false; the loop (``serve``) stops gracefully at its next tick."""
        self.ready, self.reason = False, reason
        self._stop_requested.set()

    def stop(self) -> None:
        """Graceful stop: readiness false, no new connections, requests in flight finish
        (up to ``shutdown_timeout_s``); returns once the loop ended. Idempotent."""
        self.request_stop(self.reason if not self.ready and self.reason else "stopping")
        if self._thread is not None:
            self._thread.join(self.shutdown_timeout_s + ACCEPT_DRAIN_S + 5)
        elif not self._done.is_set():  # never served: close the sockets
            self.pools.shutdown()
            wasyncore.close_all(self._map)
            self._done.set()

    def __enter__(self) -> "WebServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class StopSignal:
    """Catches SIGTERM and SIGINT from its creation on (create it before the process starts
    listening, so an early signal is not lost); ``wait()`` blocks until one arrives and
    returns its name. Create it in the main thread."""

    def __init__(self):
        self._event = threading.Event()
        self._received: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)

    def _handler(self, signum, _frame) -> None:
        self._received.append(signum)
        self._event.set()

    def wait(self) -> str:
        while not self._event.wait(3600):
            pass
        return signal.Signals(self._received[0]).name


DRAIN_HELP = ("on SIGTERM, keep answering this long with readiness false before stopping "
              "(time for load balancers and clients to notice)")


def add_drain_seconds(parser) -> None:
    """Adds ``--drain-seconds`` (float seconds, default 0) to the ``argparse`` ``parser`` of
    a role that stops gracefully: the ``drain_s`` of ``serve_forever`` (the cube server's
    data plane drains the same way)."""
    parser.add_argument("--drain-seconds", type=float, default=0.0, help=DRAIN_HELP)


def serve_forever(server: WebServer, on_stop: Callable[[], None] | None = None, drain_s: float = 0.0,
                  port_file: str | None = None, port_name: str = "http") -> int:
    """Serves ``server`` until SIGTERM or SIGINT, then stops gracefully: readiness turns
    false, ``drain_s`` seconds pass (still answering, while load balancers notice),
    ``on_stop`` runs, requests in flight finish. Once it serves, the bound port is written
    to ``port_file`` as ``{port_name: port}`` (``runtime.bound_ports``). Returns the exit
    code (0). Call from the main thread."""
    from runtime import bound_ports

    stop = StopSignal()
    server.start()
    bound_ports.write(port_file, {port_name: server.port})
    name = stop.wait()
    log.info("%s: %s received, stopping (draining %.1f s)", server.name, name, drain_s)
    server.ready, server.reason = False, "terminating"
    if drain_s > 0:
        time.sleep(drain_s)
    if on_stop is not None:
        on_stop()
    server.stop()
    log.info("%s stopped", server.name)
    return 0
